"""Multi-head latent attention (DeepSeek-V3, Kimi-K2.5's language model) on the paged cache: decodes absorbed.

The stock layer caches the latent `c` [K, R] and the roped key, then re-expands the WHOLE past
through `kv_b_proj` at every step: K x R x H x (Dn + Dv) multiply-adds per layer per step, which
for a batch of decodes is most of the step. Attention only ever needs `q_nope . (W_uk c)` and
`softmax(.) (W_uv c)`, so the per-head matrices can move to the query and the output side instead
(DeepSeek's own inference trick, used by vLLM and SGLang):

    scores = [q_nope W_uk | q_rot] . [c | k_rot]      (one "head" of keys, shared by all heads)
    out    = (softmax(scores) c) W_uv

Same weights, same cached tensors; only the order of the products changes (equal up to float
rounding). That order pays off for decodes (one query against a long past); for a prefill chunk
(many queries) the absorbed keys are wider (R + Dr = 160 against Dn + Dr = 96 on the small Kimi
checkpoint) and one key "head" sent through SDPA with grouped heads is expanded to every query
head, so a 300-token prompt's attention took 16.3 ms per layer against 7.9 ms expanded. So
prefill chunks re-expand their context's latent through `kv_b_proj` and attend per head, as the
stock layer does. Installed on the language model's attention modules by `install`, for
families whose adapter asks for it.
"""

from __future__ import annotations

import sys

import torch

from epd.engine import attention
from epd.engine.attention import StepLayout, decode_attention, prefill_attention
from epd.models.rerouting import reroute


def _is_mla(module: torch.nn.Module) -> bool:
    return all(hasattr(module, name) for name in ("kv_b_proj", "kv_a_proj_with_mqa", "kv_lora_rank",
                                                   "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))


NATIVE_ROPE = "epd_native_rope"  # a module attribute: its interleaved rope through the native kernel


def install(model: torch.nn.Module, native: bool = False) -> int:
    """Switch every MLA attention module in `model` to `paged_mla_forward`, with the native kernels
    built its interleaved rope through `rope_interleave`; returns how many."""
    count = reroute(model, _is_mla, paged_mla_forward)
    for module in model.modules():
        if _is_mla(module):
            setattr(module, NATIVE_ROPE, native and bool(module.config.rope_interleave))
    return count


def paged_mla_forward(self, hidden_states: torch.Tensor, position_embeddings, attention_mask, cache=None, **kwargs):
    """hidden_states [1, T, hidden] -> ([1, T, hidden], None); caches the latent and the roped key."""
    batch, length = hidden_states.shape[:-1]
    heads, nope, rope, rank, v_dim = (self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim,
                                      self.kv_lora_rank, self.v_head_dim)
    if self.q_lora_rank is None:
        q = self.q_proj(hidden_states)
    else:
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
    q = q.view(batch, length, heads, nope + rope).transpose(1, 2)  # [1, H, T, Dn + Dr]
    q_nope, q_rot = torch.split(q, [nope, rope], dim=-1)
    latent, k_rot = torch.split(self.kv_a_proj_with_mqa(hidden_states), [rank, rope], dim=-1)
    latent = self.kv_a_layernorm(latent).view(batch, 1, length, rank)  # [1, 1, T, R]
    k_rot = k_rot.view(batch, 1, length, rope)  # [1, 1, T, Dr]
    q_rot, k_rot = rotary(self, q_rot, k_rot, *position_embeddings)
    latent, k_rot = cache.update(latent, k_rot, self.layer_idx, kwargs=kwargs)  # [1, 1, K, R], [1, 1, K, Dr]

    layout: StepLayout = kwargs["epd_layout"]
    out = hidden_states.new_empty(length, heads, v_dim)  # [T, H, Dv]
    n = layout.num_decodes
    if n:
        gathered = layout.decode_kv_len * n
        past = None if layout.pool is not None else (latent[0, :, :gathered], k_rot[0, :, :gathered])
        out[:n] = absorbed_decodes(self, q_nope[0, :, :n], q_rot[0, :, :n], past, layout)
    for seg in layout.prefills:
        chunk = attention.chunk_queries(seg, layout, self.layer_idx)
        attention.clear_unread_rows(out, seg, chunk)
        if chunk is None:
            continue
        kv = slice(seg.kv_start, seg.kv_start + seg.kv_len)
        out[chunk.rows] = _expanded_prefill(self, q_nope[0, :, chunk.rows], q_rot[0, :, chunk.rows], latent[0, 0, kv],
                                            k_rot[0, 0, kv], chunk.mask, chunk.causal)
    return self.o_proj(out.reshape(batch, length, heads * v_dim)), None


def absorbed_decodes(self, q_nope, q_rot, past: tuple[torch.Tensor, torch.Tensor] | None,
                      layout: StepLayout) -> torch.Tensor:
    """q_nope [H, n, Dn], q_rot [H, n, Dr], past: the gathered (latent [1, n*L, R], k_rot [1, n*L, Dr]),
    or None when the native kernel reads them from the pool in place -> [n, H, Dv]."""
    heads, nope, v_dim = self.num_heads, self.qk_nope_head_dim, self.v_head_dim
    weight = self.kv_b_proj.weight.view(heads, nope + v_dim, self.kv_lora_rank)  # per head: [W_uk; W_uv]
    query = torch.cat([torch.matmul(q_nope, weight[:, :nope]), q_rot], dim=-1)  # [H, n, R + Dr]
    if past is None:  # the native kernel reads [latent | k_rot] from the pools in place
        pooled_latent, pooled_rot = layout.pool.keys[self.layer_idx], layout.pool.values[self.layer_idx]
        # Through the module, as paged_attention calls it: `bench decode --profile` times both with one patch.
        mixed = attention.pool_decode_attention(query, pooled_latent, pooled_rot, pooled_latent, layout, self.scaling)
    else:
        latent, k_rot = past
        key = torch.cat([latent, k_rot], dim=-1)  # [1, n*L, R + Dr]
        mixed = decode_attention(query, key, latent, layout, self.scaling)  # [n, H, R]
    return torch.matmul(mixed.transpose(0, 1), weight[:, nope:].transpose(1, 2)).transpose(0, 1)  # [n, H, Dv]


def _expanded_prefill(self, q_nope, q_rot, latent, k_rot, mask, causal: bool = True) -> torch.Tensor:
    """One chunk: q_nope [H, q, Dn], q_rot [H, q, Dr], its context's latent [kv, R] and k_rot [kv, Dr]
    -> [q, H, Dv]; `mask` [q, kv] bool when the chunk has a past, else None (`causal`, or every key:
    see attention.prefill_attention)."""
    heads, nope, rope, v_dim = self.num_heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim
    length = latent.shape[0]
    expanded = self.kv_b_proj(latent).view(length, heads, nope + v_dim).transpose(0, 1)  # [H, kv, Dn + Dv]
    k_nope, value = torch.split(expanded, [nope, v_dim], dim=-1)
    key = torch.cat([k_nope, k_rot.expand(heads, length, rope)], dim=-1)  # [H, kv, Dn + Dr]
    query = torch.cat([q_nope, q_rot], dim=-1)  # [H, q, Dn + Dr]
    out = prefill_attention(query, key, value, mask, self.scaling, causal=causal)  # [H, q, Dv]
    return out.transpose(0, 1)


def rotary(module: torch.nn.Module, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """q [1, H, T, Dr], k [1, 1, T, Dr] rotated by the layer's own function, or where `install` chose
    the native kernel and all is float32 by `rope_interleave`: the same bits in one call (the
    library's twenty-odd operators were 3.5% of a Kimi batch-1 decode step)."""
    if module.__dict__.get(NATIVE_ROPE) and q.dtype == cos.dtype == torch.float32 and q.device.type == "cpu":
        return torch.ops.epd.rope_interleave(q, k, cos, sin)
    return _rope(module)(q, k, cos, sin)


def _rope(module: torch.nn.Module):
    """The layer's own rotary function (interleaved or not), from the module that defines the layer."""
    source = sys.modules[type(module).__module__]
    return source.apply_rotary_pos_emb_interleave if module.config.rope_interleave else source.apply_rotary_pos_emb
