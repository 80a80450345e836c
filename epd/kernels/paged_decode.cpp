// Paged decode attention on CPU: one query token per sequence against its context, read from the
// block pool in place (no gather of every context into a padded copy first, as the torch path does).
//
// Registered as torch.ops.epd.paged_decode (TORCH_LIBRARY, so no pybind11: a faster build).
//   query   [n, Hq, Da + Db]   float32 or bfloat16, contiguous
//   key_a   [Hk, S, Da]        the pool of the cached keys (MLA: the latent)
//   key_b   [Hk, S, Db] or None  a second key pool whose columns follow key_a's (MLA: the roped key)
//   value   [Hk, S, Dv]        (MLA: the latent pool again)
//   slots   [n, L] int64       pool slot of each context token, row i valid up to lengths[i]
//   lengths [n] int64          context length of each sequence (1..L)
//   -> out  [n, Hq, Dv]        query's dtype
// Query head h attends with key head h / (Hq / Hk). Scores, softmax and the weighted sum are
// accumulated in float32 whatever the storage dtype.

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "softmax.h"
#include "vec.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

using namespace epd_vec;

constexpr int64_t kHeadsInRegisters = 8;  // query heads of a group whose sums stay in registers
// Rows ahead that are asked for, every cache line of them: a context's rows lie in blocks scattered
// over the pool, and the hardware prefetcher loses the stream at each block's end. The key pass asks
// for the values' rows too, so the value pass finds them in cache; it asks again for long contexts,
// whose early rows may have left the cache by then. Qwen's shape (4 key heads of 64), 16 sequences
// x 256 tokens in 16-slot blocks spread over a pool, one thread, Zen 5 (/tmp/s36/pd_build.py): a
// layer 1.07 ms (first line of a key row 8 ahead, of a value row in the value pass) -> 0.40 ms;
// 4 x 2048 tokens 2.13 -> 0.92 ms. The same bits: prefetches only move bytes into cache.
constexpr int64_t kPrefetchRows = 16;

template <typename T>
inline void prefetch_row(const T* row, int64_t width) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < width * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(bytes + b);
}

// Lanes [c * kLanes, c * kLanes + kLanes) of a row of `width` elements, zeros past its end.
template <typename T>
inline Vec load_chunk(const T* row, int64_t c, int64_t width) {
  const int64_t start = c * kLanes, count = std::min(kLanes, width - start);
  if (count == kLanes) return load(row + start);
  T tail[kLanes] = {};
  std::memcpy(tail, row + start, count * sizeof(T));
  return load(tail);
}
inline int64_t chunks(int64_t width) { return (width + kLanes - 1) / kLanes; }

// Strip c of the values' weighted sums for `Heads` query heads (weights [Heads, len], one row per
// head): sums[g * stride] = sum_t weights[g, t] * value row t's strip c. `Heads` is a template
// argument so that the sums stay in registers (with a runtime count GCC kept them on the stack: a
// store and a load on every row's chain, a fifth of the kernel's time).
template <int Heads, typename T>
inline void value_strip(const T* value, const int64_t* slots, int64_t len, int64_t c, int64_t dim_v,
                        const float* weights, Vec* sums, int64_t stride) {
  Vec acc[Heads] = {};
  for (int64_t t = 0; t < len; ++t) {
    if (c == 0) prefetch_row(value + slots[std::min(t + kPrefetchRows, len - 1)] * dim_v, dim_v);
    const Vec strip = load_chunk(value + slots[t] * dim_v, c, dim_v);
    for (int g = 0; g < Heads; ++g) acc[g] += weights[g * len + t] * strip;
  }
  for (int g = 0; g < Heads; ++g) sums[g * stride] = acc[g];
}

// (head, context row) dot products summed side by side: with one sum per head each row's products
// were one chain of dependent adds (four cycles each; Kimi's MLA rows are 20 vectors long). A layer
// at batch 16 x 360 tokens, one thread, AVX2 Zen 3: Kimi 1.6-1.75 -> 0.87-0.89 ms, Qwen 2.3-2.7 ->
// 1.4. 8 sums keep 8 of AVX2's 16 registers for them.
constexpr int kScoreSums = 8;
constexpr int score_rows(int heads) { return heads >= 5 ? 1 : (heads >= 3 ? 2 : kScoreSums / heads); }

// scores[g * len + t + r] = q[g] . rows[r] for the `count` rows (<= score_rows(Heads)) of `rows`
// ([kScoreSums, W] vectors; rows past `count` are read and their sums dropped) and `Heads` heads of
// q ([Heads, W] vectors).
template <int Heads>
inline void score_block(const Vec* q, const Vec* rows, int64_t width, int64_t count, float* scores, int64_t len,
                        int64_t t) {
  constexpr int Rows = score_rows(Heads);
  Vec dot[Heads][Rows] = {};
  for (int64_t c = 0; c < width; ++c)
    for (int r = 0; r < Rows; ++r) {
      const Vec k = rows[r * width + c];
      for (int g = 0; g < Heads; ++g) dot[g][r] += q[g * width + c] * k;
    }
  // r runs to the compile-time Rows (a runtime bound would index `dot` at run time and put it on the stack)
  for (int g = 0; g < Heads; ++g)
    for (int r = 0; r < Rows; ++r)
      if (r < count) scores[g * len + t + r] = sum(dot[g][r]);
}

struct Shapes {
  int64_t n, q_heads, kv_heads, length, dim_a, dim_b, dim_v;
  float scale;
};

// Every query head of one (sequence, key head) pair: reads each context row of keys and values once.
// Widths in vectors (the last one of each part zero-padded): A of Da, B of Db, V of Dv.
template <typename T>
void attend_group(const T* query, const T* key_a, const T* key_b, const T* value, const int64_t* slots,
                  int64_t len, int64_t head, const Shapes& s, T* out, std::vector<Vec>& vecs,
                  std::vector<float>& scores) {
  const int64_t group = s.q_heads / s.kv_heads, dim_q = s.dim_a + s.dim_b;
  const int64_t A = chunks(s.dim_a), B = chunks(s.dim_b), V = chunks(s.dim_v), W = A + B;
  // Zeros once per thread (resize value-initializes); every later job writes what it reads, but for
  // rows past a pass's count, whose sums are dropped.
  vecs.resize(group * (W + V) + kScoreSums * W);
  scores.resize(group * len);
  Vec* q = vecs.data();             // [G, W] scaled queries, zero past each part's width
  Vec* acc = q + group * W;         // [G, V] weighted sums of values
  Vec* rows = acc + group * V;      // [kScoreSums, W] context rows' keys, widened
  for (int64_t g = 0; g < group; ++g) {
    const T* qg = query + (head * group + g) * dim_q;
    for (int64_t c = 0; c < A; ++c) q[g * W + c] = load_chunk(qg, c, s.dim_a) * s.scale;
    for (int64_t c = 0; c < B; ++c) q[g * W + A + c] = load_chunk(qg + s.dim_a, c, s.dim_b) * s.scale;
  }
  // Rows per pass: as many as the first group of heads sums side by side (a later, smaller group of
  // a split head count sums at least as many, reading rows it drops).
  const int64_t per_pass = score_rows(static_cast<int>(std::min(kHeadsInRegisters, group)));
  for (int64_t t = 0; t < len; t += per_pass) {
    const int64_t count = std::min(per_pass, len - t);
    for (int64_t r = 0; r < count; ++r) {  // widened once, used by every head
      const int64_t ahead = slots[std::min(t + r + kPrefetchRows, len - 1)];
      prefetch_row(key_a + ahead * s.dim_a, s.dim_a);
      if (key_b) prefetch_row(key_b + ahead * s.dim_b, s.dim_b);
      if (value != key_a) prefetch_row(value + ahead * s.dim_v, s.dim_v);  // MLA: the values are key_a's rows
      const T* ka = key_a + slots[t + r] * s.dim_a;
      for (int64_t c = 0; c < A; ++c) rows[r * W + c] = load_chunk(ka, c, s.dim_a);
      for (int64_t c = 0; c < B; ++c) rows[r * W + A + c] = load_chunk(key_b + slots[t + r] * s.dim_b, c, s.dim_b);
    }
    for (int64_t g0 = 0; g0 < group; g0 += kHeadsInRegisters) {
      const Vec* qg = q + g0 * W;
      float* sc = scores.data() + g0 * len;
      switch (std::min(kHeadsInRegisters, group - g0)) {  // a head count known at compile time
        case 1: score_block<1>(qg, rows, W, count, sc, len, t); break;
        case 2: score_block<2>(qg, rows, W, count, sc, len, t); break;
        case 3: score_block<3>(qg, rows, W, count, sc, len, t); break;
        case 4: score_block<4>(qg, rows, W, count, sc, len, t); break;
        case 5: score_block<5>(qg, rows, W, count, sc, len, t); break;
        case 6: score_block<6>(qg, rows, W, count, sc, len, t); break;
        case 7: score_block<7>(qg, rows, W, count, sc, len, t); break;
        default: score_block<8>(qg, rows, W, count, sc, len, t); break;
      }
    }
  }
  for (int64_t g = 0; g < group; ++g) epd_softmax::softmax_in_place(scores.data() + g * len, len);
  // Weighted sum of values, one kLanes-wide column strip at a time with up to kHeadsInRegisters
  // heads' sums held in registers across the whole context (not loaded and stored at every row).
  for (int64_t c = 0; c < V; ++c) {
    for (int64_t g0 = 0; g0 < group; g0 += kHeadsInRegisters) {
      const int64_t heads = std::min(kHeadsInRegisters, group - g0);
      const float* weights = scores.data() + g0 * len;
      Vec* sums = acc + g0 * V + c;
      switch (heads) {  // a head count known at compile time, or the sums live on the stack
        case 1: value_strip<1>(value, slots, len, c, s.dim_v, weights, sums, V); break;
        case 2: value_strip<2>(value, slots, len, c, s.dim_v, weights, sums, V); break;
        case 3: value_strip<3>(value, slots, len, c, s.dim_v, weights, sums, V); break;
        case 4: value_strip<4>(value, slots, len, c, s.dim_v, weights, sums, V); break;
        case 5: value_strip<5>(value, slots, len, c, s.dim_v, weights, sums, V); break;
        case 6: value_strip<6>(value, slots, len, c, s.dim_v, weights, sums, V); break;
        case 7: value_strip<7>(value, slots, len, c, s.dim_v, weights, sums, V); break;
        default: value_strip<8>(value, slots, len, c, s.dim_v, weights, sums, V); break;
      }
    }
  }
  for (int64_t g = 0; g < group; ++g)
    for (int64_t d = 0; d < s.dim_v; ++d)
      out[(head * group + g) * s.dim_v + d] = static_cast<T>(acc[g * V + d / kLanes][d % kLanes]);
}

template <typename T>
void run(const at::Tensor& query, const at::Tensor& key_a, const at::Tensor* key_b, const at::Tensor& value,
         const at::Tensor& slots, const at::Tensor& lengths, const Shapes& s, at::Tensor& out) {
  const T* q = query.data_ptr<T>();
  const T* ka = key_a.data_ptr<T>();
  const T* kb = key_b ? key_b->data_ptr<T>() : nullptr;
  const T* v = value.data_ptr<T>();
  const int64_t* sl = slots.data_ptr<int64_t>();
  const int64_t* lens = lengths.data_ptr<int64_t>();
  T* o = out.data_ptr<T>();
  const int64_t slots_per_head = key_a.size(1), dim_q = s.dim_a + s.dim_b;
  at::parallel_for(0, s.n * s.kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<Vec> vecs;
    std::vector<float> scores;
    for (int64_t job = begin; job < end; ++job) {
      const int64_t i = job / s.kv_heads, h = job % s.kv_heads;
      attend_group<T>(q + i * s.q_heads * dim_q, ka + h * slots_per_head * s.dim_a,
                      kb ? kb + h * slots_per_head * s.dim_b : nullptr, v + h * slots_per_head * s.dim_v,
                      sl + i * s.length, lens[i], h, s, o + i * s.q_heads * s.dim_v, vecs, scores);
    }
  });
}

void check_pool(const at::Tensor& pool, const at::Tensor& query, int64_t kv_heads, int64_t slots, const char* name) {
  TORCH_CHECK(pool.dim() == 3 && pool.is_contiguous(), name, " must be a contiguous [Hk, S, D] pool");
  TORCH_CHECK(pool.size(0) == kv_heads && pool.size(1) == slots, name, " has shape ", pool.sizes(),
              "; expected [", kv_heads, ", ", slots, ", D]");
  TORCH_CHECK(pool.scalar_type() == query.scalar_type(), name, " is ", pool.scalar_type(), ", query ",
              query.scalar_type());
  TORCH_CHECK(pool.device().is_cpu(), name, " must be on the CPU");
}

at::Tensor paged_decode(const at::Tensor& query, const at::Tensor& key_a, const std::optional<at::Tensor>& key_b,
                        const at::Tensor& value, const at::Tensor& slots, const at::Tensor& lengths, double scale) {
  TORCH_CHECK(query.dim() == 3 && query.is_contiguous() && query.device().is_cpu(),
              "query must be a contiguous [n, Hq, D] CPU tensor");
  TORCH_CHECK(query.scalar_type() == at::kFloat || query.scalar_type() == at::kBFloat16,
              "paged_decode supports float32 and bfloat16, not ", query.scalar_type());
  const int64_t kv_heads = key_a.size(0), pool_slots = key_a.size(1);
  check_pool(key_a, query, kv_heads, pool_slots, "key_a");
  if (key_b) check_pool(*key_b, query, kv_heads, pool_slots, "key_b");
  check_pool(value, query, kv_heads, pool_slots, "value");
  Shapes s{query.size(0), query.size(1), kv_heads, slots.size(1), key_a.size(2), key_b ? key_b->size(2) : 0,
           value.size(2), static_cast<float>(scale)};
  TORCH_CHECK(s.q_heads % kv_heads == 0, "query heads ", s.q_heads, " are not a multiple of key heads ", kv_heads);
  TORCH_CHECK(s.dim_a > 0 && s.dim_v > 0, "key_a and value need a width");
  TORCH_CHECK(query.size(2) == s.dim_a + s.dim_b, "query width ", query.size(2), " != key widths ", s.dim_a, " + ",
              s.dim_b);
  TORCH_CHECK(slots.dim() == 2 && slots.size(0) == s.n && slots.scalar_type() == at::kLong && slots.is_contiguous(),
              "slots must be a contiguous int64 [n, L]");
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == s.n && lengths.scalar_type() == at::kLong &&
              lengths.is_contiguous(), "lengths must be a contiguous int64 [n]");
  const int64_t* lens = lengths.data_ptr<int64_t>();
  for (int64_t i = 0; i < s.n; ++i)
    TORCH_CHECK(lens[i] >= 1 && lens[i] <= s.length, "lengths[", i, "] = ", lens[i], " is outside 1..", s.length);
  // A slot past the pool would read outside it: check them all (n * L compares, cheap beside the attention).
  const int64_t* sl = slots.data_ptr<int64_t>();
  for (int64_t i = 0; i < s.n * s.length; ++i)
    TORCH_CHECK(sl[i] >= 0 && sl[i] < pool_slots, "slot ", sl[i], " is outside the pool of ", pool_slots);
  at::Tensor out = at::empty({s.n, s.q_heads, s.dim_v}, query.options());
  const at::Tensor* kb = key_b ? &*key_b : nullptr;
  if (query.scalar_type() == at::kBFloat16)
    run<c10::BFloat16>(query, key_a, kb, value, slots, lengths, s, out);
  else
    run<float>(query, key_a, kb, value, slots, lengths, s, out);
  return out;
}

}  // namespace

TORCH_LIBRARY(epd, m) {
  m.def("paged_decode(Tensor query, Tensor key_a, Tensor? key_b, Tensor value, Tensor slots, Tensor lengths, "
        "float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(epd, CPU, m) { m.impl("paged_decode", paged_decode); }
