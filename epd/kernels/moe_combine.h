// The weighted sum that ends an MoE layer's experts, rounded as transformers rounds it (see moe.cpp),
// shared by moe_combine (after torch's products) and moe_decode (after its own).
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "vec.h"

namespace epd_moe {

constexpr int64_t kTokensPerTask = 8;

inline float widen(float x) { return x; }
inline float widen(c10::BFloat16 x) { return static_cast<float>(x); }

// The product's rounding: bfloat16 when rows and weights both are (the library's mul_ in bfloat16).
template <bool kRoundProduct>
inline float product(float row, float weight) {
  const float p = row * weight;
  if constexpr (kRoundProduct) return epd_vec::round_bf16(p);
  return p;
}

// out[t] = sum_j rows[index[t, j]] * weights[t, j]. No fused multiply-adds here (GCC contracts
// `acc += row * w` into one by default): the library rounds each product before adding it, and the
// sum must be its bits.
template <typename T, typename W, bool kRoundProduct>
__attribute__((optimize("fp-contract=off"))) void combine(const T* rows, const int64_t* index, const W* weights,
                                                           T* out, int64_t tokens, int64_t top_k, int64_t width,
                                                           int64_t num_rows) {
  at::parallel_for(0, tokens, kTokensPerTask, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(width);
    for (int64_t t = begin; t < end; ++t) {
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j < top_k; ++j) {
        const int64_t r = index[t * top_k + j];
        TORCH_CHECK(r >= 0 && r < num_rows, "index[", t, ", ", j, "] = ", r, " is outside the ", num_rows, " rows");
        const T* row = rows + r * width;
        const float w = widen(weights[t * top_k + j]);
        for (int64_t e = 0; e < width; ++e) acc[e] += product<kRoundProduct>(widen(row[e]), w);
      }
      T* dst = out + t * width;
      for (int64_t e = 0; e < width; ++e) dst[e] = static_cast<T>(acc[e]);
    }
  });
}

// rows [R, H], index [T * k] (row of each token's j-th term), weights [T, k] -> [T, H] in rows' dtype.
inline at::Tensor combine_rows(const at::Tensor& rows, const int64_t* index, const at::Tensor& weights) {
  const auto dtype = rows.scalar_type(), weight_dtype = weights.scalar_type();
  const int64_t tokens = weights.size(0), top_k = weights.size(1), width = rows.size(1), num_rows = rows.size(0);
  at::Tensor out = at::empty({tokens, width}, rows.options());
  if (dtype == at::kBFloat16 && weight_dtype == at::kBFloat16) {
    combine<c10::BFloat16, c10::BFloat16, true>(rows.data_ptr<c10::BFloat16>(), index, weights.data_ptr<c10::BFloat16>(),
                                                out.data_ptr<c10::BFloat16>(), tokens, top_k, width, num_rows);
  } else if (dtype == at::kBFloat16 && weight_dtype == at::kFloat) {
    combine<c10::BFloat16, float, false>(rows.data_ptr<c10::BFloat16>(), index, weights.data_ptr<float>(),
                                         out.data_ptr<c10::BFloat16>(), tokens, top_k, width, num_rows);
  } else if (dtype == at::kFloat && weight_dtype == at::kFloat) {
    combine<float, float, false>(rows.data_ptr<float>(), index, weights.data_ptr<float>(), out.data_ptr<float>(),
                                 tokens, top_k, width, num_rows);
  } else {
    TORCH_CHECK(false, "moe_combine takes float32 or bfloat16 rows with float32 or bfloat16 weights (float32 rows "
                "with float32 weights), not ", dtype, " rows with ", weight_dtype, " weights");
  }
  return out;
}

}  // namespace epd_moe
