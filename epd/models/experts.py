"""MoE experts as transformers' own grouped path, with the row gathers done by `index_select`.

The library's `grouped_mm` experts forward sorts the (token, expert) pairs by expert, gathers each
pair's hidden row, runs the two grouped products, weights the rows and puts them back in token
order. It gathers with advanced indexing (`x[perm]`), which on CPU takes several times as long as
`index_select` of the same rows (5392 rows of 512 in bfloat16: 2.5 ms against 0.5 ms; float32
5.0 against 1.2), and a prompt's forward gathers twice per MoE layer: prefill of four 337-token
prompts took 17% (Kimi) and 25% (Qwen) less CPU in bfloat16 with `index_select`, 3% in float32.
The same rows in the same order go through the same products and the same sum, so the output is
the library's bit for bit. The routing weights are applied after the rows are back in token order
(the same products, in another order), and the rows are converted to the weights' dtype first:
DeepSeek-V3's router (Kimi) gives float32 weights to bfloat16 rows, and the library's mixed-dtype
product goes through a slow casting loop (a 4 x 337-token Kimi prompt step 7% less CPU in bfloat16,
paired A/B in one process). Layers this does not cover (biases, no gate, a post-expert norm,
expert parallelism) run the library's own forward.

On a CPU in bfloat16 the two grouped products become two batched ones (`torch.bmm`)
over every expert, each expert's rows padded to the busiest one's count. A grouped
product there is one oneDNN call per expert, and at decode sizes (a few rows each) that call's
fixed cost is most of the MoE layer: a bfloat16 decode step took 7-16% less time at batch 4-16,
an 84-token prompt chunk 16-19% less, a 340-token prompt the same (paired A/Bs in one process,
both small checkpoints, Intel AMX). The padding is only taken while it costs little: the batched
products read every expert's weights, so the idle experts' bytes must cost less to read than the
calls saved (small experts, most of them busy; a checkpoint with large experts keeps the grouped
products unless nearly all are busy), and the padded rows may be at most 4x the real ones. Each
row meets the same weights over the same reduction; on that machine the output equalled the
grouped path's bit for bit, and elsewhere it may differ in the last bfloat16 bit. In float32 MKL
picks other kernels for the two (differences of 1e-6) and the batched form was 4-9% slower at
decode, so float32 keeps the grouped products and the library's exact output (but for decode steps
under `--kernels native`/`auto`, which moe_decode computes: below, and for prompt steps there, whose
experts' rows go through oneDNN one expert at a time where it is available: `onednn_experts_forward`,
2.2-2.4x MKL's speed on a CPU where MKL runs AVX2 code, values within float32 rounding).

Registered with transformers' `ExpertsInterface` and chosen with `set_experts_implementation`, the
library's own switch; the language role installs it (the `hf` baseline keeps the stock path).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedModel
from transformers.activations import SiLUActivation
from transformers.integrations.moe import (
    ALL_EXPERTS_FUNCTIONS,
    _default_apply_gate,
    _grouped_linear,
    grouped_mm_experts_forward,
)

from epd.engine import onednn_linear
from epd.kernels import WIDTH_MULTIPLE
from epd.models.shape_buckets import bucket_rows

NAME = "epd_grouped_mm"
NATIVE_NAME = "epd_grouped_mm_native"  # the same, combining through our C++ kernel (epd/kernels/moe.cpp)
ONEDNN_NAME = "epd_grouped_mm_native_onednn"  # and in float32 each expert's rows through oneDNN
# The weight bytes one product call's fixed cost is worth: oneDNN spent 40-50 us on a call with a
# few bfloat16 rows, in which time one core reads about 1 MiB (20-30 GB/s).
_CALL_COST_BYTES = 1 << 20
# moe_decode takes a call while its (token, expert) pairs are at most this many per expert: it reads
# only the busy experts' weights but multiplies without oneDNN's blocking, so with many rows per
# expert the batched products win. Whole small-checkpoint decode steps (16 experts, top-4), bfloat16,
# interleaved in one process (/tmp/s28/ab_step4.py), torch's experts against moe_decode: one thread,
# Qwen 8.6 / 5.9 ms at batch 1, 14.7 / 9.9 at 4, 18.1 / 13.9 at 8, 20.5 / 19.2 at 16, even at 24;
# Kimi 11.0 / 8.5, 18.0 / 13.3, 20.0 / 16.5, 22.5 / 20.9. Two threads (2 vCPUs), Qwen: 8.8 / 7.0,
# 12.9 / 11.7, 15.7 / 15.5, 19.0 / 21.6: there it scales less than oneDNN and takes fewer.
NATIVE_DECODE_PAIRS_PER_EXPERT = 4.0
NATIVE_DECODE_PAIRS_PER_EXPERT_THREADED = 2.0
# In float32 MKL's per-call cost is higher than oneDNN's bfloat16 one and moe_decode wins further out
# (AVX2 Zen 3, /tmp/s29/ab_step.py and ab_thr*.py, whole steps interleaved in one process), MKL's
# grouped products against it: one thread, Kimi 13.6 / 11.5 ms at batch 1, 25.0 / 19.8 at 4, 35.0 /
# 27.0 at 8, 50.6 / 36.3 at 16, 72.8 / 58.8 at 32 (8 pairs per expert); Qwen 13.3 / 9.5, 24.5 /
# 17.5, 58.3 / 43.2 at 16. Two threads, batch 16: Kimi 45.0 / 35.0, Qwen 58.5 / 36.1; Kimi at 32:
# 65.7 / 61.1.
NATIVE_DECODE_PAIRS_PER_EXPERT_FLOAT32 = 8.0
NATIVE_DECODE_DTYPES = (torch.bfloat16, torch.float32)


def grouped_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                            top_k_weights: torch.Tensor) -> torch.Tensor:
    """hidden_states [T, H], top_k_index / top_k_weights [T, k] -> [T, H] (as the library computes it)."""
    return _experts_forward(self, hidden_states, top_k_index, top_k_weights, _combine)


def native_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                           top_k_weights: torch.Tensor) -> torch.Tensor:
    """As `grouped_experts_forward`, the rows combined by torch.ops.epd.moe_combine (one pass, same bits);
    a decode step's few tokens through torch.ops.epd.moe_decode (each busy expert's weights read once,
    no other expert's; sums in another order than the library's, so not its bits)."""
    return _native_forward(self, hidden_states, top_k_index, top_k_weights)


def onednn_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                           top_k_weights: torch.Tensor) -> torch.Tensor:
    """As `native_experts_forward`, a float32 prompt step's expert products through oneDNN
    (epd.engine.onednn_linear: 2.2-2.4x MKL's speed at 84-337 rows where MKL runs AVX2 code); a
    decode-only step's stay with MKL."""
    prompt = hidden_states.dtype == torch.float32 and not onednn_linear.decoding()
    return _native_forward(self, hidden_states, top_k_index, top_k_weights, _onednn_products if prompt else None)


def _native_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                    products: Callable | None = None) -> torch.Tensor:
    if _decodes_natively(self, hidden_states, top_k_index):
        return torch.ops.epd.moe_decode(hidden_states.contiguous(), top_k_index.contiguous(),
                                        top_k_weights.contiguous(), self.gate_up_proj, self.down_proj)
    return _experts_forward(self, hidden_states, top_k_index, top_k_weights, _native_combine, products)


def _pairs_per_expert(dtype: torch.dtype) -> float:
    """The most pairs per expert moe_decode takes in `dtype` on the calling thread's OpenMP threads."""
    if dtype == torch.float32:
        return NATIVE_DECODE_PAIRS_PER_EXPERT_FLOAT32
    one = torch.get_num_threads() == 1
    return NATIVE_DECODE_PAIRS_PER_EXPERT if one else NATIVE_DECODE_PAIRS_PER_EXPERT_THREADED


def _decodes_natively(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor) -> bool:
    """Whether moe_decode computes this layer's call: a few (token, expert) pairs on a CPU, rows and
    weights both bfloat16 or both float32, the library's layout ([E, 2I, H] and [E, H, I]) and gating
    (silu(gate) * up, gate first)."""
    return (hidden_states.device.type == "cpu" and hidden_states.dtype in NATIVE_DECODE_DTYPES
            and top_k_index.numel() <= _pairs_per_expert(hidden_states.dtype) * self.num_experts
            and _native_decode_layer(self, hidden_states.dtype))


def _native_decode_layer(self, dtype: torch.dtype) -> bool:
    """The parts of `_decodes_natively` that depend on the layer alone (and the rows' dtype)."""
    gate_up, down = self.gate_up_proj, self.down_proj
    return (gate_up.dtype == dtype and down.dtype == dtype and not _library_only(self)
            and not self.is_transposed and isinstance(self.act_fn, (SiLUActivation, torch.nn.SiLU))
            and getattr(self._apply_gate, "__func__", None) is _default_apply_gate
            and gate_up.shape[-1] % WIDTH_MULTIPLE == 0 and down.shape[-1] % WIDTH_MULTIPLE == 0
            and gate_up.is_contiguous() and down.is_contiguous())


def float32_decode_pairs(self) -> int | None:
    """The most (token, expert) pairs of a float32 decode call that this layer's installed forward
    sends to moe_decode (whatever the thread count: float32's limit is fixed), or None where that
    forward is not ours or the layer is not one moe_decode takes (epd.engine.direct_decode)."""
    if getattr(self.config, "_experts_implementation", None) not in (NATIVE_NAME, ONEDNN_NAME):
        return None
    weight = self.gate_up_proj
    if weight.device.type != "cpu" or not _native_decode_layer(self, torch.float32):
        return None
    return int(_pairs_per_expert(torch.float32) * self.num_experts)


def _library_only(self) -> bool:
    """A layer these forwards do not cover: biases, no gate, a post-expert norm, expert parallelism."""
    return self.has_bias or not self.has_gate or self.has_post_expert_norm or self._is_expert_parallel


def _experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor,
                     combine: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor],
                     products: Callable | None = None) -> torch.Tensor:
    if _library_only(self):
        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    tokens, top_k = top_k_index.shape
    experts, perm = torch.sort(top_k_index.reshape(-1))  # [T*k]: pairs grouped by expert
    token_of_pair = perm // top_k  # [T*k]
    if _batches_well(hidden_states) and (padded := _padded_products(self, hidden_states, token_of_pair, experts)):
        out, row_of_pair = padded  # [E*W, H], [T*k]: each sorted pair's row of out
    else:
        out = (products or _grouped_products)(self, hidden_states.index_select(0, token_of_pair), experts)
        row_of_pair = None
    back = torch.empty_like(perm)
    back[perm] = torch.arange(perm.numel(), device=perm.device)  # [T*k]: each (token, j) pair's sorted place
    index = back if row_of_pair is None else row_of_pair.index_select(0, back)  # [T*k]: its row of out
    return combine(out, index.view(tokens, top_k), top_k_weights, hidden_states.dtype)


def _combine(out: torch.Tensor, index: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """out [R, H], index / weights [T, k] -> [T, H]: each token's rows weighted and summed, the library's way
    (each product in the promoted dtype, the sum over k, then the input's dtype)."""
    rows = out.index_select(0, index.reshape(-1)).view(*index.shape, -1)  # [T, k, H] token order again
    rows = rows.to(torch.promote_types(rows.dtype, weights.dtype)).mul_(weights.unsqueeze(-1))
    return rows.sum(dim=1).to(dtype)


def _native_combine(out: torch.Tensor, index: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if out.device.type != "cpu" or out.dtype != dtype or not out.is_contiguous() \
            or not _sums_in_order(index.shape[1], out.shape[1]):
        return _combine(out, index, weights, dtype)
    return torch.ops.epd.moe_combine(out, index, weights.contiguous())


def _sums_in_order(top_k: int, width: int) -> bool:
    """Whether torch sums a [T, top_k, width] tensor over top_k one row after another, as the kernel does;
    pure. It does for up to 4 rows, or rows of a multiple of 32 elements (torch 2.14 on x86: 32 float32
    lanes per vectorized step); other widths of 5+ rows it adds in another order, whose bits the
    kernel would not reproduce. Every checkpoint we know has a hidden size that is a multiple of 32."""
    return top_k <= 4 or width % 32 == 0


def _grouped_products(self, rows: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """rows [N, H] sorted by expert, experts [N] (sorted) -> [N, H] through each row's expert (the library's way)."""
    # histc over floats, as the library does on CPU (where it has no integer histogram).
    per_expert = torch.histc(experts.float() if experts.device.type in ("cpu", "mps") else experts.int(),
                             bins=self.num_experts, min=0, max=self.num_experts - 1)
    offsets = torch.cumsum(per_expert, dim=0, dtype=torch.int32)  # [E]
    out = _grouped_linear(rows, self.gate_up_proj, offsets, is_transposed=self.is_transposed)  # [N, 2I]
    return _grouped_linear(self._apply_gate(out), self.down_proj, offsets, is_transposed=self.is_transposed)


def _onednn_products(self, rows: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """As `_grouped_products`, each expert's rows through oneDNN (epd.engine.onednn_linear.linear, which
    pads them to its row buckets); rows [N, H] sorted by expert, experts [N] (sorted) -> [N, H]."""
    counts = torch.bincount(experts, minlength=self.num_experts).tolist()  # rows per expert
    out, start = rows.new_empty(rows.shape), 0  # [N, H]
    for expert, count in enumerate(counts):
        if count:
            gate_up, down = self.gate_up_proj[expert], self.down_proj[expert]  # [2I, H], [H, I] (else transposed)
            if self.is_transposed:
                gate_up, down = gate_up.t(), down.t()
            mid = self._apply_gate(onednn_linear.linear(rows[start:start + count], gate_up))  # [count, I]
            out[start:start + count] = onednn_linear.linear(mid, down)
            start += count
    return out


def _batches_well(rows: torch.Tensor) -> bool:
    """Whether the batched products may pay off at all: bfloat16 on a CPU (see the module doc; float16
    was not measured)."""
    return rows.device.type == "cpu" and rows.dtype == torch.bfloat16


def _padded_products(self, hidden_states: torch.Tensor, token_of_pair: torch.Tensor, experts: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """As `_grouped_products`, through two `bmm`s over per-expert blocks padded to the busiest one's rows,
    when that is cheap (else None): ([E*W, H] products, [N] each sorted pair's place among them).

    hidden_states [T, H]; token_of_pair [N] each sorted pair's token; experts [N] sorted."""
    count = torch.bincount(experts, minlength=self.num_experts)  # [E] rows per expert
    num_experts, pairs = self.num_experts, experts.shape[0]
    width, hit = int(count.max()), int((count > 0).sum())
    expert_bytes = (self.gate_up_proj[0].numel() + self.down_proj[0].numel()) * self.gate_up_proj.element_size()
    # Pad only where the idle experts' weights cost less to read than the calls saved cost, and
    # where padding at most quadruples the rows.
    if (num_experts - hit) * expert_bytes > 2 * hit * _CALL_COST_BYTES or num_experts * width > 4 * pairs:
        return None
    width = bucket_rows(width)  # a prompt step's widths vary: a few sizes, so oneDNN's kernels are reused
    first = torch.cumsum(count, dim=0) - count  # [E] index of each expert's first row
    slots = experts * width + torch.arange(pairs, device=experts.device) - first.index_select(0, experts)  # [N]
    # One gather straight into the blocks. A padding row repeats token 0: a product's rows are
    # independent, so what a padding row holds never reaches a real one, and its output is never read
    # (zeros there cost a fill, a gather and a scatter instead of this one gather).
    source = token_of_pair.new_zeros(num_experts * width).index_copy_(0, slots, token_of_pair)  # [E*W]
    padded = hidden_states.index_select(0, source)  # [E*W, H]
    gate_up = self.gate_up_proj if self.is_transposed else self.gate_up_proj.transpose(-2, -1)  # [E, H, 2I]
    down = self.down_proj if self.is_transposed else self.down_proj.transpose(-2, -1)  # [E, I, H]
    out = torch.bmm(padded.view(num_experts, width, -1), gate_up)  # [E, W, 2I]
    out = torch.bmm(self._apply_gate(out), down)  # [E, W, H]
    return out.view(num_experts * width, -1), slots


def install(model: torch.nn.Module) -> int:
    """Use `grouped_experts_forward` in every MoE layer of `model`; returns how many (sub)models switched.

    Each (sub)model whose class supports the switch is switched itself: the role classes that drop
    the vision side live in our module, which transformers' check (a look at the class's source)
    does not recognise, so a switch asked of the top model would not reach its text model."""
    return _switch(model, NAME, grouped_experts_forward, lambda module: module._can_set_experts_implementation())


def install_native(model: torch.nn.Module, onednn: bool = False) -> int:
    """Switch the (sub)models `install` switched to `native_experts_forward` (torch.ops.epd.moe_combine
    and .moe_decode must be loaded: epd.kernels.native), or with `onednn` to `onednn_experts_forward`;
    returns how many."""
    name, forward = (ONEDNN_NAME, onednn_experts_forward) if onednn else (NATIVE_NAME, native_experts_forward)
    return _switch(model, name, forward,
                   lambda module: getattr(module.config, "_experts_implementation", None) == NAME)


def _switch(model: torch.nn.Module, name: str, forward: Callable, applies: Callable[[PreTrainedModel], bool]) -> int:
    ALL_EXPERTS_FUNCTIONS.register(name, forward)
    switched = 0
    for module in model.modules():
        if isinstance(module, PreTrainedModel) and applies(module):
            module.set_experts_implementation(name)
            switched += 1
    return switched
