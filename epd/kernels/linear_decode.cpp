// A dense layer's product for a decode step's few rows, in float32: y = x w^T reading w once per
// four rows, as moe_decode reads an expert's weights (row_products.h).
//
// At these sizes MKL's sgemm reads the weights at a third to a half of one core's bandwidth (AVX2
// Zen 3, one thread, a [512, 512] weight out of cache: 11.7 GB/s for one row, 8.1 for two, 4.7
// for sixteen, against 20 GB/s measured), and a float32 decode step is mostly its dense layers'
// weight reads at batch 1-4.
//
// torch.ops.epd.linear_decode(x [T, K], w [N, K]) -> [T, N], all float32, as F.linear(x, w) up to
// the order of each dot product's sum (a few units in the last place).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "row_products.h"

namespace {

using namespace epd_rows;

// Outputs per parallel job: 64 rows of w (128 KiB at K = 512) stay in L2 while every tile of
// kMaxRows rows of x passes over them.
constexpr int64_t kBlock = 64;

at::Tensor linear_decode(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu() && x.is_contiguous() && w.is_contiguous(),
              "linear_decode takes contiguous CPU tensors");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "linear_decode takes float32, not ",
              x.scalar_type(), " and ", w.scalar_type());
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x ", x.sizes(), " and w ", w.sizes(),
              " are not [T, K] and [N, K]");
  const int64_t rows = x.size(0), k = x.size(1), outputs = w.size(0);
  TORCH_CHECK(k % kLanes == 0, "linear_decode needs K a multiple of ", kLanes, " (got ", k, ")");
  at::Tensor y = at::empty({rows, outputs}, x.options());  // [T, N]
  const float *xs = x.data_ptr<float>(), *ws = w.data_ptr<float>();
  float* ys = y.data_ptr<float>();
  const int64_t blocks = (outputs + kBlock - 1) / kBlock;
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t n0 = block * kBlock, count = std::min(kBlock, outputs - n0);
      for (int64_t r = 0; r < rows; r += kMaxRows)
        times_weights(static_cast<int>(std::min<int64_t>(kMaxRows, rows - r)), xs + r * k, ws + n0 * k, count, k,
                      ys + r * outputs + n0, outputs);
    }
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(epd, m) { m.def("linear_decode(Tensor x, Tensor w) -> Tensor"); }

TORCH_LIBRARY_IMPL(epd, CPU, m) { m.impl("linear_decode", linear_decode); }
