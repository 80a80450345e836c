// What the kernels here share: float vectors one register wide through GCC/Clang vector extensions
// (16 lanes with AVX-512, else 8: AVX2's and two NEON registers' width), so no kernel needs per-ISA
// intrinsics; loads that widen bfloat16; a horizontal sum; e^x as a polynomial the compiler
// vectorizes (std::exp is a call per element).
//
// Why not 16 lanes everywhere: without AVX-512, GCC 12 keeps a 64-byte vector that a loop carries
// (an accumulator) in memory and moves it through general registers on every iteration; the decode
// attention ran 8x slower on an AVX2 Zen 3 than with one-register vectors, and the kernels that hold
// several accumulators need them to fit AVX2's 16 registers anyway.
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

namespace epd_vec {

#if defined(__AVX512F__)
constexpr int64_t kLanes = 16;
#else
constexpr int64_t kLanes = 8;
#endif
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));
typedef uint16_t Half __attribute__((vector_size(kLanes * sizeof(uint16_t))));
typedef uint32_t Wide __attribute__((vector_size(kLanes * sizeof(uint32_t))));
typedef float Vec8 __attribute__((vector_size(8 * sizeof(float))));
typedef float Vec4 __attribute__((vector_size(4 * sizeof(float))));

inline Vec load(const float* src) {
  Vec v;
  std::memcpy(&v, src, sizeof(v));
  return v;
}
inline Vec load(const c10::BFloat16* src) {  // bfloat16 is float32's top half: widen by a shift
  Half h;
  std::memcpy(&h, src, sizeof(h));
  const Wide bits = __builtin_convertvector(h, Wide) << 16;
  Vec v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

inline void store(float* dst, Vec v) { std::memcpy(dst, &v, sizeof(v)); }

inline float round_bf16(float x) { return static_cast<float>(static_cast<c10::BFloat16>(x)); }

inline Vec8 halves(Vec v) {  // the sum of the two 8-lane halves (16 lanes), or v itself (8)
#if defined(__AVX512F__)
  return __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
         __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
#else
  return v;
#endif
}

inline float sum(Vec v) {  // halving tree: shuffle + add steps, not one lane extraction per lane
  const Vec8 h8 = halves(v);
  const Vec4 h4 = __builtin_shufflevector(h8, h8, 0, 1, 2, 3) + __builtin_shufflevector(h8, h8, 4, 5, 6, 7);
  return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}

// e^x = 2^(x log2 e) split into 2^k * 2^f, f in [-0.5, 0.5]: k (rounded to nearest: adding
// 1.5 * 2^23 drops the fraction) and 2^f as a polynomial, relative error ~2e-7; for a float or,
// lane by lane, a Vec.
template <typename V>
inline V exp2_split(V x, V& k) {
  const V y = x * 1.44269504f;
  k = (y + 12582912.f) - 12582912.f;
  const V f = y - k;
  V p = f * 1.5353362e-4f + 1.3398874e-3f;
  p = p * f + 9.6184817e-3f;
  p = p * f + 5.5503340e-2f;
  p = p * f + 2.4022652e-1f;
  p = p * f + 6.9314718e-1f;
  return p * f + 1.f;
}

// e^x for x in [-87, 88.7], k in [-126, 128]: 2^k is built in two halves so that k = 128 (x above
// 88.03) stays finite.
inline float exp_in_range(float x) {
  float k;
  const float p = exp2_split(x, k);
  const int32_t top = k > 127.f ? 127 : static_cast<int32_t>(k);  // 2^k = 2^top * (2 or 1)
  const int32_t bits = (top + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale * (k > 127.f ? 2.f : 1.f);
}

// e^x lane by lane for x in [-87, 87] (callers clamp), on whole vectors: the compiler does not
// vectorize a loop of scalar calls over a vector's lanes.
typedef int32_t IntVec __attribute__((vector_size(kLanes * sizeof(int32_t))));
inline Vec exp_in_range(Vec x) {
  Vec k;
  const Vec p = exp2_split(x, k);
  const IntVec bits = (__builtin_convertvector(k, IntVec) + 127) << 23;  // 2^k, k in [-126, 126]
  Vec scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// e^x for x <= 0 (scores minus their max), for a float or, lane by lane, a Vec: below -87 it is
// under float's smallest normal, and 0 after a softmax's sum.
template <typename V>
inline V exp_nonpositive(V x) { return exp_in_range(x < -87.f ? -87.f : x); }

// e^x over float's whole range, as expf: 0 below -87.3, infinity above 88.72.
inline float exp_any(float x) {
  const float e = exp_in_range(std::min(std::max(x, -87.3f), 88.72f));
  return x > 88.72f ? std::numeric_limits<float>::infinity() : (x < -87.3f ? 0.f : e);
}

}  // namespace epd_vec
