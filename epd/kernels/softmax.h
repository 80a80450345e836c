// A row of float32 scores replaced by its softmax, e^(x - max) / sum, in place: shared by the decode
// attention (paged_decode.cpp, a head's scores over its context) and the vision attention's rows
// (softmax_rows.cpp). e^x is vec.h's polynomial (relative error ~2e-7).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "vec.h"

namespace epd_softmax {

using namespace epd_vec;

// The largest of n floats: a vector of running maxima, then its lanes (one compare after another
// is a 4-cycle chain per score).
inline float max_of(const float* x, int64_t n) {
  Vec lanes = Vec{} - std::numeric_limits<float>::infinity();
  int64_t t = 0;
  for (; t + kLanes <= n; t += kLanes) {
    const Vec v = load(x + t);
    lanes = lanes < v ? v : lanes;
  }
  float top = lanes[0];
  for (int64_t j = 1; j < kLanes; ++j) top = std::max(top, lanes[j]);
  for (; t < n; ++t) top = std::max(top, x[t]);
  return top;
}

// x[0:n] (n >= 1) -> softmax(x[0:n]).
inline void softmax_in_place(float* x, int64_t n) {
  const float top = max_of(x, n);
  // e^(x - top) a vector at a time, summed in kLanes running sums: a float sum one score after
  // another is a chain of dependent adds (four cycles each).
  Vec lanes = {};
  int64_t t = 0;
  for (; t + kLanes <= n; t += kLanes) {
    const Vec e = exp_nonpositive(load(x + t) - top);
    store(x + t, e);
    lanes += e;
  }
  float total = sum(lanes);
  for (; t < n; ++t) total += (x[t] = exp_nonpositive(x[t] - top));
  const float inv = 1.f / total;
  for (t = 0; t + kLanes <= n; t += kLanes) store(x + t, load(x + t) * inv);
  for (; t < n; ++t) x[t] *= inv;
}

}  // namespace epd_softmax
