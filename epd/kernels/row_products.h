// y = x w^T for a few rows of x, streaming w once: what a decode step's products are (a handful of
// tokens against a weight matrix read from DRAM). Shared by moe_decode (each busy expert's rows) and
// linear_decode (a dense layer's, as one expert).
//
// Every (row, output) pair sums k/kLanes vector products in its own accumulator and adds the lanes
// with a halving tree; the order differs from MKL's or oneDNN's, so results differ from theirs by a
// few units in float32's last place (bfloat16: by a rounding step, where `rounded` rounds).
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "vec.h"

namespace epd_rows {

using namespace epd_vec;

constexpr int kMaxRows = 4;     // rows (tokens) multiplied per pass over the weights
constexpr int kOutputs = 4;     // outputs computed together, sharing each row chunk's load
constexpr int kAheadGroups = 2;  // the weights asked for are this many groups of kOutputs rows ahead

// Holds v in a register from here on. GCC otherwise reloads each weight vector once per row
// (a load looks free to it) and folds every row's load into its multiply-add: two loads per
// multiply-add, which made the four-row product load-bound (an AVX-512 Zen 4, one thread: 32
// GFLOP/s with the weights in L2, 100 held). An empty asm that claims to change the value pins it.
// Only with AVX-512's 32 registers, where the 16 sums, 4 weight vectors and a row fit; AVX2 has 16.
inline void keep_in_register(Vec& v) {
#if defined(__AVX512F__)
  asm("" : "+v"(v));
#else
  (void)v;
#endif
}

// The dtype's rounding of a float32 result: bfloat16's, or none.
template <typename T>
inline float rounded(float x) {
  if constexpr (std::is_same_v<T, c10::BFloat16>) return round_bf16(x);
  return x;
}

// y[r, n] = rounded(x[r, :] . w[n, :]) for `Rows` rows of x (float32, width k, k a multiple of
// kLanes) and n < outputs rows of w (T, width k); y has `y_stride` floats per row. `next`: the
// next_outputs weight rows (width k) the caller multiplies after these (or null), whose first rows
// are asked for while these rows' last are multiplied.
template <int Rows, typename T>
inline void rows_times_weights(const float* x, const T* w, int64_t outputs, int64_t k, float* y, int64_t y_stride,
                               const T* next, int64_t next_outputs) {
  int64_t n = 0;
  for (; n + kOutputs <= outputs; n += kOutputs) {
    Vec acc[Rows][kOutputs] = {};
    // Weight rows kAheadGroups groups on (contiguous: kOutputs * k * sizeof(T) bytes a group), past
    // these rows' end the next call's, are asked for while these are multiplied, as many bytes per
    // step of kLanes as the step reads: one core's loads alone do not keep enough reads in flight to
    // stream DRAM at its bandwidth. Into L2 (locality 2), not L1, where they held its few fill
    // buffers: with that, the next call's rows and the registers above, linear_decode streams 120
    // MB of [1536, 512] weights at 19-23 GB/s against 13-17 at 1-4 rows, 14 against 8.5 at 8 (AVX-512
    // Zen 4, one thread; a plain sum reads 21-29).
    const int64_t target = n + kAheadGroups * kOutputs;  // the first weight row asked for
    const T* target_row = target + kOutputs <= outputs                         ? w + target * k
                          : next && target - outputs + kOutputs <= next_outputs ? next + (target - outputs) * k
                                                                                : nullptr;
    const char* ahead = reinterpret_cast<const char*>(target_row);
    constexpr int64_t kStepBytes = kOutputs * kLanes * sizeof(T);  // cache lines of 64 bytes: 1-4
    for (int64_t c = 0; c < k; c += kLanes) {
      if (ahead)
        for (int64_t line = 0; line < kStepBytes; line += 64)
          __builtin_prefetch(ahead + c * kOutputs * sizeof(T) + line, 0, 2);
      Vec wv[kOutputs];
      for (int o = 0; o < kOutputs; ++o) {
        wv[o] = load(w + (n + o) * k + c);
        keep_in_register(wv[o]);
      }
      for (int r = 0; r < Rows; ++r) {
        Vec xv = load(x + r * k + c);
        keep_in_register(xv);
        for (int o = 0; o < kOutputs; ++o) acc[r][o] += xv * wv[o];
      }
    }
    for (int r = 0; r < Rows; ++r)
      for (int o = 0; o < kOutputs; ++o) y[r * y_stride + n + o] = rounded<T>(sum(acc[r][o]));
  }
  for (; n < outputs; ++n) {
    Vec acc[Rows] = {};
    for (int64_t c = 0; c < k; c += kLanes) {
      const Vec wv = load(w + n * k + c);
      for (int r = 0; r < Rows; ++r) acc[r] += load(x + r * k + c) * wv;
    }
    for (int r = 0; r < Rows; ++r) y[r * y_stride + n] = rounded<T>(sum(acc[r]));
  }
}

template <typename T>
inline void times_weights(int rows, const float* x, const T* w, int64_t outputs, int64_t k, float* y,
                          int64_t y_stride, const T* next, int64_t next_outputs) {
  switch (rows) {  // a row count known at compile time, so the sums stay in registers
    case 1: rows_times_weights<1>(x, w, outputs, k, y, y_stride, next, next_outputs); break;
    case 2: rows_times_weights<2>(x, w, outputs, k, y, y_stride, next, next_outputs); break;
    case 3: rows_times_weights<3>(x, w, outputs, k, y, y_stride, next, next_outputs); break;
    default: rows_times_weights<4>(x, w, outputs, k, y, y_stride, next, next_outputs); break;
  }
}

// Up to kMaxRows consecutive rows of x (for moe_decode: pairs, in expert order) that multiply one
// expert's weights ([E, outputs, k]; a dense layer is expert 0).
struct Tile {
  int64_t expert, first, rows;
};

// Rows [begin, end) of x against `expert`, as tiles of up to kMaxRows rows.
inline void append_tiles(std::vector<Tile>& tiles, int64_t expert, int64_t begin, int64_t end) {
  for (int64_t first = begin; first < end; first += kMaxRows)
    tiles.push_back({expert, first, std::min<int64_t>(kMaxRows, end - first)});
}

// out[q, n0:n0+count] = x[q] . w[expert][n] for every tile's rows q, over every block of kBlock
// outputs and tile in parallel: a decode step has a few rows (and busy experts), so the work is split
// by output rows too. Block-major: the tiles of one block run one after another, so an expert's 64
// weight rows (128 KiB at k = 512, float32) are still in L2 when its next tile passes over them.
constexpr int64_t kBlock = 64;
template <typename T>
void tiles_times_weights(const std::vector<Tile>& tiles, const float* x, int64_t k, const T* w, int64_t outputs,
                         float* out) {
  const int64_t blocks = (outputs + kBlock - 1) / kBlock, count_tiles = static_cast<int64_t>(tiles.size());
  const auto first_output = [&](int64_t job) { return (job / count_tiles) * kBlock; };
  const auto weights_of = [&](int64_t job) { return w + (tiles[job % count_tiles].expert * outputs + first_output(job)) * k; };
  at::parallel_for(0, blocks * count_tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t job = begin; job < end; ++job) {
      const Tile& tile = tiles[job % count_tiles];
      const int64_t n0 = first_output(job), count = std::min(kBlock, outputs - n0);
      const bool more = job + 1 < end;  // this thread's next job: its weights are asked for early
      times_weights(static_cast<int>(tile.rows), x + tile.first * k, weights_of(job), count, k,
                    out + tile.first * outputs + n0, outputs, more ? weights_of(job + 1) : nullptr,
                    more ? std::min(kBlock, outputs - first_output(job + 1)) : 0);
    }
  });
}

}  // namespace epd_rows
