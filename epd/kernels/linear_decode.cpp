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
// torch.ops.epd.linear_rows(x [..., K], w [N, K], max_rows) -> [..., N]: the same for 1..max_rows
// rows of float32, else at::linear(x, w); a layer's whole forward in one call (decode_linear.py),
// since the Python around the product had cost a third as much as the product itself.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <torch/library.h>

#include <cstdint>
#include <vector>

#include "row_products.h"

namespace {

using namespace epd_rows;

at::Tensor linear_decode(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu() && x.is_contiguous() && w.is_contiguous(),
              "linear_decode takes contiguous CPU tensors");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat, "linear_decode takes float32, not ",
              x.scalar_type(), " and ", w.scalar_type());
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "x ", x.sizes(), " and w ", w.sizes(),
              " are not [T, K] and [N, K]");
  const int64_t rows = x.size(0), k = x.size(1), outputs = w.size(0);
  TORCH_CHECK(k % kLanes == 0, "linear_decode needs K a multiple of ", kLanes, " (got ", k, ")");
  std::vector<Tile> tiles;  // every row against the one weight, as "expert" 0
  append_tiles(tiles, 0, 0, rows);
  at::Tensor y = at::empty({rows, outputs}, x.options());  // [T, N]
  tiles_times_weights(tiles, x.data_ptr<float>(), k, w.data_ptr<float>(), outputs, y.data_ptr<float>());
  return y;
}

at::Tensor linear_rows(const at::Tensor& x, const at::Tensor& w, int64_t max_rows) {
  const int64_t k = x.dim() ? x.size(-1) : 0, rows = k ? x.numel() / k : 0;
  if (rows < 1 || rows > max_rows || x.scalar_type() != at::kFloat || w.scalar_type() != at::kFloat ||
      !x.device().is_cpu() || !w.is_contiguous() || k % kLanes != 0)
    return at::linear(x, w);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = w.size(0);
  return linear_decode(x.reshape({rows, k}).contiguous(), w).view(shape);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(epd, m) {
  m.def("linear_decode(Tensor x, Tensor w) -> Tensor");
  m.def("linear_rows(Tensor x, Tensor w, int max_rows) -> Tensor");
}

TORCH_LIBRARY_IMPL(epd, CPU, m) {
  m.impl("linear_decode", linear_decode);
  m.impl("linear_rows", linear_rows);
}
