// RMSNorm in one pass (read a row, write a row) as transformers' Qwen3-VL-MoE and DeepSeek-V3
// layers compute it: y = weight * to_dtype(x * rsqrt(mean(x^2) + eps)), the mean and the scaling in
// float32, then the product with the weight in the storage dtype. The library's forward takes
// seven operators and as many passes over temporaries (x^2, the float32 copy, ...): 3-4x slower
// on a [1120, 512] prompt step's rows, and each small decode call paying seven dispatches.
//
// Registered as torch.ops.epd.rms_norm(x [..., D] contiguous, weight [D] same dtype, eps) -> [..., D].
// The sum of squares runs in a different order from torch's, so float32 outputs can differ in the
// last bit (about a third of them on random rows; bfloat16 ones, rounded after, almost never).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>

namespace {

constexpr int64_t kLanes = 16;  // independent partial sums, so the compiler vectorizes the sum of squares
constexpr int64_t kRowsPerTask = 16;

template <typename T>
inline float widen(T x) { return static_cast<float>(x); }  // c10::BFloat16's own conversion: a shift

template <typename T>
void normalize_rows(const T* x, const T* weight, T* out, int64_t rows, int64_t width, float eps) {
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* row = x + r * width;
      T* dst = out + r * width;
      float partial[kLanes] = {0.f};
      int64_t d = 0;
      for (; d + kLanes <= width; d += kLanes)
        for (int64_t j = 0; j < kLanes; ++j) partial[j] += widen(row[d + j]) * widen(row[d + j]);
      float squares = 0.f;
      for (; d < width; ++d) squares += widen(row[d]) * widen(row[d]);
      for (int64_t j = 0; j < kLanes; ++j) squares += partial[j];
      const float inverse = 1.f / std::sqrt(squares / static_cast<float>(width) + eps);
      for (int64_t e = 0; e < width; ++e) {
        const T normed = static_cast<T>(widen(row[e]) * inverse);  // rounded to the dtype, as .to(input_dtype)
        dst[e] = static_cast<T>(widen(weight[e]) * widen(normed));
      }
    }
  });
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && x.dim() >= 1, "x must be a contiguous CPU tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "rms_norm supports float32 and bfloat16, not ", x.scalar_type());
  TORCH_CHECK(weight.dim() == 1 && weight.is_contiguous() && weight.size(0) == x.size(-1), "weight has shape ",
              weight.sizes(), "; expected [", x.size(-1), "]");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "weight is ", weight.scalar_type(), ", x ", x.scalar_type());
  const int64_t width = x.size(-1), rows = width ? x.numel() / width : 0;
  at::Tensor out = at::empty_like(x);
  if (x.scalar_type() == at::kBFloat16)
    normalize_rows(x.data_ptr<c10::BFloat16>(), weight.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(),
                   rows, width, static_cast<float>(eps));
  else
    normalize_rows(x.data_ptr<float>(), weight.data_ptr<float>(), out.data_ptr<float>(), rows, width,
                   static_cast<float>(eps));
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(epd, m) { m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor"); }

TORCH_LIBRARY_IMPL(epd, CPU, m) { m.impl("rms_norm", rms_norm); }
