// An MoE layer's experts for a few tokens (decode steps), bfloat16 or float32: each expert that a
// token routes to reads its weights once, straight from the [E, N, K] tensors, and no other expert's.
//
// torch's paths each cost more than the bytes at these sizes: the grouped products are two oneDNN
// calls per busy expert (25-35 us each of fixed cost, about what reading half a MiB takes), and the
// batched products pad every expert to the busiest one's rows and read all of them, busy or not
// (a batch-4 Qwen decode step read all 16 experts of every layer for the ~10 that were busy).
//
// torch.ops.epd.moe_decode(hidden [T, H], index [T, k] int64, weights [T, k], gate_up [E, 2I, H],
//                          down [E, H, I]) -> [T, H]: hidden, gate_up and down all bfloat16 (the
//   weights bfloat16 or float32) or all float32 (the weights float32),
//   as transformers' experts forward with gate, up = (x @ gate_up[e]^T).chunk(2), silu(gate) * up,
//   @ down[e]^T, weighted and summed over each token's k experts; in bfloat16 rounded where the
//   library's operators round (each product's output, silu's, the gated product's, the weighted
//   terms as moe_combine does). The dot products sum in another order than oneDNN's or MKL's, so a
//   value can differ from the library's by a bfloat16 step (float32: a few units in the last place).

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "moe_combine.h"
#include "row_products.h"

namespace {

using namespace epd_rows;

template <typename T>
inline float silu(float g) {  // rounded as the library's silu in T
  return rounded<T>(g / (1.f + exp_any(-g)));
}

template <typename T>
at::Tensor run(const at::Tensor& hidden, const at::Tensor& index, const at::Tensor& weights,
               const at::Tensor& gate_up, const at::Tensor& down) {
  const int64_t tokens = hidden.size(0), h = hidden.size(1), top_k = index.size(1), pairs = tokens * top_k;
  const int64_t experts = gate_up.size(0), inter = down.size(2);
  const int64_t* idx = index.data_ptr<int64_t>();
  // The pairs in expert order (a counting sort), each one's place in that order, and the tiles.
  std::vector<int64_t> count(experts + 1, 0), order(pairs), place(pairs);
  for (int64_t p = 0; p < pairs; ++p) {
    TORCH_CHECK(idx[p] >= 0 && idx[p] < experts, "index[", p / top_k, ", ", p % top_k, "] = ", idx[p],
                " is not one of the ", experts, " experts");
    ++count[idx[p] + 1];
  }
  for (int64_t e = 0; e < experts; ++e) count[e + 1] += count[e];  // count[e]: expert e's first place
  std::vector<int64_t> next(count.begin(), count.end() - 1);
  for (int64_t p = 0; p < pairs; ++p) order[place[p] = next[idx[p]]++] = p;
  std::vector<Tile> tiles;
  for (int64_t e = 0; e < experts; ++e) append_tiles(tiles, e, count[e], count[e + 1]);
  // Each pair's hidden row, widened, in expert order: [P, H].
  const T* hid = hidden.data_ptr<T>();
  std::vector<float> x(pairs * h), gu(pairs * 2 * inter), act(pairs * inter);
  at::Tensor y = at::empty({pairs, h}, hidden.options().dtype(at::kFloat));  // [P, H] in expert order
  for (int64_t q = 0; q < pairs; ++q)
    for (int64_t d = 0; d < h; ++d) x[q * h + d] = static_cast<float>(hid[(order[q] / top_k) * h + d]);
  tiles_times_weights(tiles, x.data(), h, gate_up.data_ptr<T>(), 2 * inter, gu.data());  // [P, 2I]
  for (int64_t q = 0; q < pairs; ++q)  // silu(gate) * up, rounded as the library rounds: [P, I]
    for (int64_t i = 0; i < inter; ++i)
      act[q * inter + i] = rounded<T>(silu<T>(gu[q * 2 * inter + i]) * gu[q * 2 * inter + inter + i]);
  tiles_times_weights(tiles, act.data(), inter, down.data_ptr<T>(), h, y.data_ptr<float>());
  // Each pair's output is a T value already (rounded as the library's product output is), so the
  // conversion is exact; weighted and summed over each token's experts by moe_combine's combine.
  return epd_moe::combine_rows(y.to(hidden.scalar_type()), place.data(), weights);
}

at::Tensor moe_decode(const at::Tensor& hidden, const at::Tensor& index, const at::Tensor& weights,
                      const at::Tensor& gate_up, const at::Tensor& down) {
  for (const at::Tensor* t : {&hidden, &index, &weights, &gate_up, &down})
    TORCH_CHECK(t->device().is_cpu() && t->is_contiguous(), "moe_decode takes contiguous CPU tensors");
  TORCH_CHECK(hidden.dim() == 2 && (hidden.scalar_type() == at::kBFloat16 || hidden.scalar_type() == at::kFloat),
              "hidden must be [T, H] bfloat16 or float32");
  const auto dtype = hidden.scalar_type();
  TORCH_CHECK(index.dim() == 2 && index.size(0) == hidden.size(0) && index.scalar_type() == at::kLong,
              "index must be [T, k] int64 with T = ", hidden.size(0));
  TORCH_CHECK(weights.sizes() == index.sizes(), "weights have shape ", weights.sizes(), "; expected ", index.sizes());
  TORCH_CHECK(gate_up.dim() == 3 && down.dim() == 3 && gate_up.scalar_type() == dtype && down.scalar_type() == dtype,
              "gate_up and down must be [E, 2I, H] and [E, H, I] in hidden's dtype, ", dtype);
  const int64_t h = hidden.size(1), inter = down.size(2);
  TORCH_CHECK(gate_up.size(2) == h && gate_up.size(1) == 2 * inter && down.size(1) == h &&
                  down.size(0) == gate_up.size(0),
              "gate_up ", gate_up.sizes(), " and down ", down.sizes(), " do not fit hidden rows of ", h);
  TORCH_CHECK(h % kLanes == 0 && inter % kLanes == 0, "moe_decode needs H and I multiples of ", kLanes, " (got ", h,
              ", ", inter, ")");
  TORCH_CHECK(weights.scalar_type() == at::kFloat || (dtype == at::kBFloat16 && weights.scalar_type() == at::kBFloat16),
              "weights must be float32 (or bfloat16 with bfloat16 hidden rows), not ", weights.scalar_type());
  if (dtype == at::kBFloat16) return run<c10::BFloat16>(hidden, index, weights, gate_up, down);
  return run<float>(hidden, index, weights, gate_up, down);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(epd, m) {
  m.def("moe_decode(Tensor hidden, Tensor index, Tensor weights, Tensor gate_up, Tensor down) -> Tensor");
}

TORCH_LIBRARY_IMPL(epd, CPU, m) { m.impl("moe_decode", moe_decode); }
