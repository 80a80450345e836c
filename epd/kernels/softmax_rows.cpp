// Softmax over each row of a float32 score matrix, in place, its columns past `valid` masked out:
// the vision towers' attention (epd/engine/vision_attention.py), one head's [n, n'] scores at a time.
//
// torch.ops.epd.softmax_rows_(x [R, C] float32 contiguous, valid in 1..C) -> x: each row's first
//   `valid` columns replaced by their softmax, e^(x - max) / sum, the rest (keys padded to oneDNN's
//   row buckets) by 0.
// ATen's softmax writes a new [R, C] tensor (4 MiB a head at a 1024-patch image, fresh pages each
// call) after the caller has filled the padded columns with -inf: on one Zen 5 thread 500 us a
// [1024, 1024] head, 11% of a Kimi small tower (18 of 160 ms an image). Here a row is read from and
// written to L1, three passes (max, exponent and sum, scale). e^x is vec.h's polynomial (relative
// error ~2e-7, where ATen's Sleef exp is 1 ulp), so probabilities differ from ATen's by a few units
// of float32's last place, as the products around them (oneDNN's, not SDPA's) already do.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "softmax.h"

namespace {

constexpr int64_t kGrainRows = 8;  // rows per task: 32 KiB at 1024 columns

// The row's first `valid` columns by their softmax, the rest by 0.
void softmax_row(float* row, int64_t valid, int64_t columns) {
  epd_softmax::softmax_in_place(row, valid);
  std::fill(row + valid, row + columns, 0.f);
}

at::Tensor& softmax_rows_(at::Tensor& x, int64_t valid) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && x.dim() == 2 && x.scalar_type() == at::kFloat,
              "softmax_rows_ takes a contiguous float32 [R, C] CPU tensor, not ", x.scalar_type(), " ", x.sizes());
  const int64_t rows = x.size(0), columns = x.size(1);
  TORCH_CHECK(valid >= 1 && valid <= columns, "valid = ", valid, " is outside 1..", columns);
  float* data = x.data_ptr<float>();
  at::parallel_for(0, rows, kGrainRows, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) softmax_row(data + r * columns, valid, columns);
  });
  return x;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(epd, m) { m.def("softmax_rows_(Tensor(a!) x, int valid) -> Tensor(a!)"); }

TORCH_LIBRARY_IMPL(epd, CPU, m) { m.impl("softmax_rows_", softmax_rows_); }
