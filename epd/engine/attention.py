"""The attention function registered with transformers for packed, paged forwards.

A step's forward is one `[1, T]` row holding several sequences: first every sequence that computes
a single token (decodes), then the prefill chunks. The paged cache hands the attention, per layer,
the keys/values of every context in the same order: the decode group padded to one common length
(padding points at the zero block and is masked out), then each prefill's context exactly. So the
decodes run as one batched SDPA call and each prefill chunk as one causal call whose queries sit at
the end of its context (bottom-right aligned).

Key and value head dims may differ (DeepSeek-V3 MLA expands [nope | rope] keys, smaller values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

if TYPE_CHECKING:
    from epd.engine.paged_cache import PagedKVCache

ATTENTION_NAME = "epd_paged"


@dataclass(frozen=True)
class PrefillSegment:
    q_start: int  # index of the chunk's first token in the packed row
    q_len: int
    kv_start: int  # index of its context's first key in the packed keys
    kv_len: int  # context length: cached past + this chunk
    mask: torch.Tensor | None  # [q_len, kv_len] bool when the chunk has a past, else None (plain causal)
    samples: bool = True  # its last token's logits are kept (the prompt's last chunk)


@dataclass(frozen=True)
class StepLayout:
    """What the cache and the attention need to know about one step, shared by all layers."""

    slot_mapping: torch.Tensor  # [T] long: pool slot where each new token's K/V is written
    kv_index: torch.Tensor  # [K] long: pool slot of every key, in the order described above
    num_decodes: int  # the first num_decodes tokens are single-token sequences
    decode_kv_len: int  # their padded context length
    decode_mask: torch.Tensor | None  # [num_decodes, 1, decode_kv_len] bool: True = attend
    prefills: tuple[PrefillSegment, ...]
    decode_slots: torch.Tensor | None = None  # [num_decodes, decode_kv_len] long: context slots, 0 past the end
    decode_lengths: torch.Tensor | None = None  # [num_decodes] long: each decode's context length
    # Set when the decodes read this pool in place (the native kernel, epd.engine.native_kernels):
    # then kv_index holds only the prefills' contexts, and their kv_start count from 0.
    pool: PagedKVCache | None = None
    # The layer whose attention computes only the rows whose logits are kept (epd.engine.last_layer).
    sampled_only_layer: int | None = None

    def to(self, device: torch.device) -> StepLayout:
        """The same layout with every tensor on `device` (itself when they are there already, as on CPU)."""
        if self.slot_mapping.device == device:
            return self

        def move(tensor: torch.Tensor | None) -> torch.Tensor | None:
            return None if tensor is None else tensor.to(device, non_blocking=True)

        segments = tuple(PrefillSegment(s.q_start, s.q_len, s.kv_start, s.kv_len, move(s.mask), s.samples)
                         for s in self.prefills)
        return StepLayout(move(self.slot_mapping), move(self.kv_index), self.num_decodes, self.decode_kv_len,
                          move(self.decode_mask), segments, move(self.decode_slots), move(self.decode_lengths),
                          self.pool, self.sampled_only_layer)


@dataclass(frozen=True)
class ChunkQueries:
    """The query rows of a prefill chunk that one layer computes, and how they attend."""

    rows: slice  # into the packed row
    mask: torch.Tensor | None  # [len(rows), kv_len] bool, or None
    causal: bool  # without a mask: causal (queries at the start of the context) or all keys


def chunk_queries(seg: PrefillSegment, layout: StepLayout, layer_idx: int | None) -> ChunkQueries | None:
    """Every query row of the chunk, causal; or, in the layer that computes only sampled rows, the
    chunk's last row, which sees its whole context, or none when the chunk does not sample (pure)."""
    if layer_idx is None or layer_idx != layout.sampled_only_layer:
        return ChunkQueries(slice(seg.q_start, seg.q_start + seg.q_len), seg.mask, True)
    if not seg.samples:
        return None
    last = seg.q_start + seg.q_len - 1
    return ChunkQueries(slice(last, last + 1), None, False)


def clear_unread_rows(out: torch.Tensor, seg: PrefillSegment, chunk: ChunkQueries | None) -> None:
    """Zero the chunk's rows of `out` ([T, H, Dv]) that this layer does not compute: nothing reads them."""
    if chunk is None or chunk.rows.stop - chunk.rows.start < seg.q_len:
        out[seg.q_start:seg.q_start + seg.q_len] = 0


def causal_chunk_mask(q_len: int, kv_len: int) -> torch.Tensor:
    """[q_len, kv_len] bool: query i (absolute position kv_len - q_len + i) sees keys up to itself."""
    offset = kv_len - q_len
    return torch.arange(kv_len)[None, :] <= (torch.arange(q_len)[:, None] + offset)


def paged_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask, scaling: float | None = None, dropout: float = 0.0,
                    epd_layout: StepLayout | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """query [1, Hq, T, Dk], key [1, Hk, K, Dk], value [1, Hk, K, Dv] -> ([1, T, Hq, Dv], None)."""
    if epd_layout is None:
        raise RuntimeError(f"{ATTENTION_NAME} attention needs the engine's step layout (epd_layout=...)")
    layout = epd_layout
    heads, tokens = query.shape[1], query.shape[2]
    gqa = heads != key.shape[1]
    out = query.new_empty(tokens, heads, value.shape[-1])  # [T, Hq, Dv]
    n = layout.num_decodes
    if n and layout.pool is not None:
        layer = module.layer_idx
        out[:n] = pool_decode_attention(query[0, :, :n], layout.pool.keys[layer], None, layout.pool.values[layer],
                                        layout, scaling)
    elif n:
        out[:n] = decode_attention(query[0, :, :n], key[0, :, :n * layout.decode_kv_len],
                                   value[0, :, :n * layout.decode_kv_len], layout, scaling)
    for seg in layout.prefills:
        chunk = chunk_queries(seg, layout, getattr(module, "layer_idx", None))
        clear_unread_rows(out, seg, chunk)
        if chunk is None:
            continue
        q = query[:, :, chunk.rows]  # [1, Hq, q, Dk]
        k = key[:, :, seg.kv_start:seg.kv_start + seg.kv_len]  # [1, Hk, kv, Dk]
        v = value[:, :, seg.kv_start:seg.kv_start + seg.kv_len]  # [1, Hk, kv, Dv]
        o = prefill_attention(q, k, v, chunk.mask, scaling, gqa, chunk.causal)  # [1, Hq, q, Dv]
        out[chunk.rows] = o[0].transpose(0, 1)
    return out.unsqueeze(0), None


def prefill_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                      scaling: float | None, gqa: bool = False, causal: bool = True) -> torch.Tensor:
    """SDPA of one chunk: query [..., Hq, q, Dk], key [..., Hk, kv, Dk], value [..., Hk, kv, Dv]
    -> [..., Hq, q, Dv]; `mask` [q, kv] bool (True = attend) when the chunk has a past, else None:
    causal, or (`causal` False) every query sees every key, as a chunk's last row does.

    SDPA's flash kernel on CPU needs Dv == Dk and otherwise falls back to the math path, which
    materialises every score and mask (MLA's 64-wide values against 96-wide keys: a 337-token
    prompt's attention took 12.3 ms per layer against 4.4 ms). So values narrower than the keys are
    zero-padded and the padding's columns of the output (all zero) are dropped, as transformers'
    own DeepSeek-V3 layer does for flash attention.
    """
    v_dim = value.shape[-1]
    if v_dim < key.shape[-1]:
        value = F.pad(value, (0, key.shape[-1] - v_dim))
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, is_causal=causal and mask is None,
                                         scale=scaling, enable_gqa=gqa)
    return out[..., :v_dim]


def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: StepLayout,
                     scaling: float | None) -> torch.Tensor:
    """One query per sequence: query [Hq, n, Dk], key [Hk, n*L, Dk], value [Hk, n*L, Dv] -> [n, Hq, Dv].

    Written out rather than through SDPA: with grouped heads SDPA's CPU path expands keys to every
    query head (for MLA's 8 heads over one latent "head" that was 27x slower); here each group of
    query heads multiplies its one key head directly.
    """
    heads, n, dim = query.shape
    kv_heads, length = key.shape[0], layout.decode_kv_len
    group = heads // kv_heads
    q = query.view(kv_heads, group, n, dim).transpose(1, 2)  # [Hk, n, G, Dk]
    k = key.view(kv_heads, n, length, dim)  # [Hk, n, L, Dk]: a view, keys stay where the gather put them
    v = value.view(kv_heads, n, length, value.shape[-1])  # [Hk, n, L, Dv]
    scores = torch.matmul(q, k.transpose(-1, -2)) * (dim ** -0.5 if scaling is None else scaling)  # [Hk, n, G, L]
    scores = scores.masked_fill(~layout.decode_mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)
    out = torch.matmul(probs, v)  # [Hk, n, G, Dv]
    return out.permute(1, 0, 2, 3).reshape(n, heads, v.shape[-1])  # [n, Hq, Dv]


def pool_decode_attention(query: torch.Tensor, key_a: torch.Tensor, key_b: torch.Tensor | None, value: torch.Tensor,
                          layout: StepLayout, scaling: float | None) -> torch.Tensor:
    """decode_attention read from the pool in place by the native kernel (epd/kernels/paged_decode.cpp):
    query [Hq, n, Da + Db]; key_a [Hk, slots, Da], key_b [Hk, slots, Db] or None (its columns follow
    key_a's), value [Hk, slots, Dv]: one layer's pools -> [n, Hq, Dv]."""
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    return torch.ops.epd.paged_decode(query.transpose(0, 1).contiguous(), key_a, key_b, value,
                                      layout.decode_slots, layout.decode_lengths, scale)


def register() -> str:
    """Register the function with transformers (idempotent); returns the name to set on a config."""
    AttentionInterface.register(ATTENTION_NAME, paged_attention)
    return ATTENTION_NAME
