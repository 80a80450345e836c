// RMSNorm in one pass (read a row, write a row) as transformers' Qwen3-VL-MoE and DeepSeek-V3
// layers compute it: y = weight * to_dtype(x * rsqrt(mean(x^2) + eps)), the mean and the scaling in
// float32, then the product with the weight in the storage dtype. The library's forward takes
// seven operators and as many passes over temporaries (x^2, the float32 copy, ...): 3-4x slower
// on a [1120, 512] prompt step's rows, and each small decode call paying seven dispatches.
//
// Bit for bit the library's result: the sum of squares adds in the order of ATen's CPU sum
// (ReduceOps' cascade_sum over a contiguous row), the only operator of the seven whose order is
// not fixed by its formula. An MoE router can sit on a near-tie that a last-bit difference in a
// norm tips (bench/README: a 47/48 at --seed 481), and then a whole answer parts from `generate`.
//
// Registered as torch.ops.epd.rms_norm(x [..., D] contiguous, weight [D] same dtype, eps) -> [..., D].

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "no_fma.h"

namespace {

constexpr int64_t kRowsPerTask = 16;

// The float vector width of the kernel that ATen's sum runs: 8 on every x86 CPU, AVX-512 ones
// included. ATen registers its sum with REGISTER_DISPATCH, which leaves the AVX-512 slot empty (its
// AVX-512 reductions were slower), so an "AVX512" CPU runs the AVX2 kernel: Vectorized<float> of 8.
// Taking 16 there (stop 33) parted from the library's bits on 1 row in 4 (an AVX-512 Zen 4).
constexpr int64_t kSumLanes = 8;

template <typename T>
inline float widen(T x) { return static_cast<float>(x); }  // c10::BFloat16's own conversion: a shift

typedef float Vec1 __attribute__((vector_size(sizeof(float))));
typedef float Vec8 __attribute__((vector_size(8 * sizeof(float))));

template <int64_t L, typename T>
struct Squares {
  // GCC takes no vector_size that depends on L
  using Vec = std::conditional_t<L == 8, Vec8, Vec1>;
  static_assert(L == 1 || L == 8);
  static EPD_NO_FMA inline Vec at(const T* src) {  // src[0..L)^2, one ATen Vectorized<float> load
    Vec v;
    if constexpr (sizeof(T) == sizeof(float)) {
      std::memcpy(&v, src, sizeof(v));
    } else {
      for (int64_t j = 0; j < L; ++j) v[j] = widen(src[j]);
    }
    return v * v;
  }
};

inline int64_t ceil_log2(int64_t x) {  // ATen's utils::CeilLog2, 1 for x <= 2
  return x <= 2 ? 1 : 64 - __builtin_clzll(static_cast<uint64_t>(x - 1));
}

// sum(row[0..width)^2) in ATen's order for L-float vectors (kSumLanes, or 1): the row's whole
// vectors as groups of 4 (four accumulators), whose
// sums cascade every 16 groups through 4 levels to keep long rows accurate; then the leftover
// vectors into the first accumulator, the four into one, and the leftover scalars, then the lanes,
// one by one into a float. Each square is rounded before it is added, as ATen's pow(2) writes it.
template <int64_t L, typename T>
EPD_NO_FMA float sum_of_squares(const T* row, int64_t width) {
  using S = Squares<L, T>;
  using Vec = typename S::Vec;
  constexpr int64_t kIlp = 4, kLevels = 4;
  const int64_t vectors = width / L, groups = vectors / kIlp;
  const int64_t level_power = std::max<int64_t>(4, ceil_log2(groups) / kLevels);
  const int64_t level_step = int64_t{1} << level_power, level_mask = level_step - 1;
  Vec acc[kLevels][kIlp] = {};
  int64_t i = 0;
  while (i + level_step <= groups) {
    for (int64_t j = 0; j < level_step; ++j, ++i)
      for (int64_t k = 0; k < kIlp; ++k) acc[0][k] += S::at(row + (i * kIlp + k) * L);
    for (int64_t level = 1; level < kLevels; ++level) {
      for (int64_t k = 0; k < kIlp; ++k) {
        acc[level][k] += acc[level - 1][k];
        acc[level - 1][k] = Vec{};
      }
      if ((i & (level_mask << (level * level_power))) != 0) break;
    }
  }
  for (; i < groups; ++i)
    for (int64_t k = 0; k < kIlp; ++k) acc[0][k] += S::at(row + (i * kIlp + k) * L);
  for (int64_t level = 1; level < kLevels; ++level)
    for (int64_t k = 0; k < kIlp; ++k) acc[0][k] += acc[level][k];
  Vec total = acc[0][0];
  for (int64_t v = groups * kIlp; v < vectors; ++v) total += S::at(row + v * L);
  for (int64_t k = 1; k < kIlp; ++k) total += acc[0][k];
  float sum = 0.f;
  for (int64_t e = vectors * L; e < width; ++e) sum += widen(row[e]) * widen(row[e]);
  for (int64_t j = 0; j < L; ++j) sum += total[j];
  return sum;
}

// A row narrower than a vector ATen sums one float at a time, in the same order (L = 1).
template <typename T>
float row_sum_of_squares(const T* row, int64_t width) {
  return width >= kSumLanes ? sum_of_squares<kSumLanes>(row, width) : sum_of_squares<1>(row, width);
}

template <typename T>
void normalize(const T* x, const T* weight, T* out, int64_t rows, int64_t width, float eps) {
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* row = x + r * width;
      T* dst = out + r * width;
      const float mean = row_sum_of_squares(row, width) / static_cast<float>(width);  // ATen: sum, then div_
      const float inverse = 1.f / std::sqrt(mean + eps);  // ATen's rsqrt: 1 / sqrt, each rounded
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
    normalize(x.data_ptr<c10::BFloat16>(), weight.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(), rows,
              width, static_cast<float>(eps));
  else
    normalize(x.data_ptr<float>(), weight.data_ptr<float>(), out.data_ptr<float>(), rows, width,
              static_cast<float>(eps));
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(epd, m) { m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor"); }

TORCH_LIBRARY_IMPL(epd, CPU, m) { m.impl("rms_norm", rms_norm); }
