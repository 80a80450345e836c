"""Multi-head latent attention (DeepSeek-V3, Kimi-K2.5's language model) with the up-projection absorbed.

The stock layer caches the latent `c` [K, R] and the roped key, then re-expands the WHOLE past
through `kv_b_proj` at every step: K x R x H x (Dn + Dv) multiply-adds per layer per step, which
for a batch of decodes is most of the step. Attention only ever needs `q_nope . (W_uk c)` and
`softmax(.) (W_uv c)`, so the per-head matrices can move to the query and the output side instead
(DeepSeek's own inference trick, used by vLLM and SGLang):

    scores = [q_nope W_uk | q_rot] . [c | k_rot]      (one "head" of keys, shared by all heads)
    out    = (softmax(scores) c) W_uv

Same weights, same cached tensors, same attention function; only the order of the products
changes (equal up to float rounding). Installed on the language model's attention modules by
`install`, for families whose adapter asks for it.
"""

from __future__ import annotations

import sys

import torch

from epd.engine.attention import paged_attention
from epd.models.rerouting import reroute


def _is_mla(module: torch.nn.Module) -> bool:
    return all(hasattr(module, name) for name in ("kv_b_proj", "kv_a_proj_with_mqa", "kv_lora_rank",
                                                   "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))


def install(model: torch.nn.Module) -> int:
    """Switch every MLA attention module in `model` to the absorbed forward; returns how many."""
    return reroute(model, _is_mla, absorbed_forward)


def absorbed_forward(self, hidden_states: torch.Tensor, position_embeddings, attention_mask, cache=None, **kwargs):
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
    q_rot, k_rot = _rope(self)(q_rot, k_rot, *position_embeddings)
    latent, k_rot = cache.update(latent, k_rot, self.layer_idx, kwargs=kwargs)  # [1, 1, K, R], [1, 1, K, Dr]

    weight = self.kv_b_proj.weight.view(heads, nope + v_dim, rank)  # per head: [W_uk; W_uv]
    query = torch.cat([torch.matmul(q_nope, weight[:, :nope]), q_rot], dim=-1)  # [1, H, T, R + Dr]
    key = torch.cat([latent, k_rot], dim=-1)  # [1, 1, K, R + Dr]
    out, _ = paged_attention(self, query, key, latent, attention_mask, scaling=self.scaling, **kwargs)  # [1, T, H, R]
    out = torch.matmul(out.transpose(1, 2), weight[:, nope:].transpose(1, 2))  # [1, H, T, Dv]
    return self.o_proj(out.transpose(1, 2).reshape(batch, length, heads * v_dim)), None


def _rope(module: torch.nn.Module):
    """The layer's own rotary function (interleaved or not), from the module that defines the layer."""
    source = sys.modules[type(module).__module__]
    return source.apply_rotary_pos_emb_interleave if module.config.rope_interleave else source.apply_rotary_pos_emb
