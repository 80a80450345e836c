"""A decode-only step's forward as direct calls on the layers' weights, not through the modules.

Through the modules, a decode step spends about as long in Python as in its products: every
layer's forward and its submodules' `__call__`, the checks of our rerouted forwards (is this a
decode step, which kernel, which dtype), module attribute lookups and the library's wrappers
(output capture, deprecated-kwarg shims, the causal-mask builder) run at every step, while at a
few sequences each product reads its weights in microseconds. perf on the small Kimi checkpoint
(float32, batch 2, one thread, Zen 4): 22% of a 12.4 ms step in the interpreter and 5% in torch's
argument parsing. Here every decoder layer's parts are resolved once, at engine start (weights,
norms' epsilons, the kernel each part's forward picks in a decode step), and a step calls the same
operators in the same order on them, so its logits are the module path's bit for bit
(tests/model/test_direct_decode.py). The engine's step, both ways interleaved in one process
(/tmp/s38/ab3.py: the small checkpoints, context 330, Zen 4), one thread: Kimi 12.8 -> 10.2 ms at
batch 2, 23.7 -> 22.1 at 16, 52.2 -> 48.2 at 32; Qwen 9.1 -> 7.3, 22.7 -> 20.4, 36.8 -> 34.4 (a
fifth less at 1-2 sequences, 7-10% at 16-32); two threads: Kimi 8.4 -> 6.4 and 16.0 -> 13.8, Qwen
7.1 -> 5.3 and 15.7 -> 13.8.

It is built only where every part is one this file knows, as the engine installs it with the
native kernels in float32: `decode_linear` products, the fused RMSNorm, `moe_decode` experts, the
paged decode attention reading the pool in place (and Kimi's absorbed latent attention). Anything
else (bfloat16, `--kernels torch`, a layer of another kind) keeps the module path, and `build`
says why. A step with a prompt chunk or an image, or with an image/video placeholder id among its
tokens (Kimi's forward maps those to id 0 before embedding), runs through the modules as well.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.activations import SiLUActivation

from epd.engine import attention, decode_linear, fused_norm, mla, ungrouped_router
from epd.engine.attention import StepLayout
from epd.engine.paged_cache import PagedKVCache
from epd.models import experts

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin) of the step's positions


class NotDirect(Exception):
    """A part of the model that the direct forward does not cover (the message says which)."""


def _kernel(name: str):
    """The native op's one overload (calling it skips the packet's overload resolution)."""
    return getattr(torch.ops.epd, name).default


def _forward_of(module: torch.nn.Module):
    """The function bound as `module.forward` (ours after a reroute, else the class's), or None where
    the forward is not a bound method (a wrapper such as epd.engine.last_layer's): then no part
    matches it, and the build says NotDirect rather than failing."""
    return getattr(module.forward, "__func__", None)


@dataclass(frozen=True)
class Linear:
    weight: torch.Tensor  # [out, in] float32
    rows: Callable  # torch.ops.epd.linear_rows: its kernel up to MAX_ROWS rows, else at::linear

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.rows(x, self.weight, decode_linear.MAX_ROWS)

    @classmethod
    def of(cls, module: torch.nn.Module) -> Linear:
        if _forward_of(module) not in (decode_linear.decode_linear_forward, decode_linear.decode_linear_forward_onednn):
            raise NotDirect(f"a linear layer ({module}) is not the native float32 decode product")
        return cls(module.weight, _kernel("linear_rows"))


@dataclass(frozen=True)
class Norm:
    weight: torch.Tensor
    eps: float
    kernel: Callable  # torch.ops.epd.rms_norm

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel(x.contiguous(), self.weight, self.eps)

    @classmethod
    def of(cls, module: torch.nn.Module) -> Norm:
        if _forward_of(module) is not fused_norm.fused_rms_norm_forward or module.weight.dtype != torch.float32:
            raise NotDirect(f"{type(module).__name__} is not the fused float32 RMSNorm")
        return cls(module.weight, module.variance_epsilon, _kernel("rms_norm"))


@dataclass(frozen=True)
class GatedMlp:
    """down(silu(gate(x)) * up(x)): a dense layer, or DeepSeek-V3's shared experts."""

    gate: Linear
    up: Linear
    down: Linear

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))

    @classmethod
    def of(cls, module: torch.nn.Module) -> GatedMlp:
        if not isinstance(getattr(module, "act_fn", None), (SiLUActivation, torch.nn.SiLU)):
            raise NotDirect(f"{type(module).__name__}'s activation is not SiLU")
        return cls(Linear.of(module.gate_proj), Linear.of(module.up_proj), Linear.of(module.down_proj))


@dataclass(frozen=True)
class Experts:
    module: torch.nn.Module  # its own forward, for calls of more pairs than moe_decode takes
    max_pairs: int
    kernel: Callable  # torch.ops.epd.moe_decode

    def __call__(self, rows: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """rows [T, H], index / weights [T, k] -> [T, H], as the installed forward computes it."""
        e = self.module
        for hook in e._forward_pre_hooks.values():  # still seen by the module's pre-hooks (bench decode counts hits)
            hook(e, (rows, index, weights))
        if index.numel() > self.max_pairs:
            return e.forward(rows, index, weights)
        return self.kernel(rows.contiguous(), index.contiguous(), weights.contiguous(), e.gate_up_proj, e.down_proj)

    @classmethod
    def of(cls, module: torch.nn.Module) -> Experts:
        pairs = experts.float32_decode_pairs(module)
        if pairs is None:
            raise NotDirect(f"{type(module).__name__} does not decode through moe_decode in float32")
        return cls(module, pairs, _kernel("moe_decode"))


@dataclass(frozen=True)
class SharedExpertMoe:
    """DeepSeek-V3's MoE layer (Kimi-K2.5): routed experts plus shared ones, as DeepseekV3MoE.forward."""

    router: torch.nn.Module  # its forward is ungrouped_router_forward
    experts: Experts
    shared: GatedMlp

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        _, weights, index = self.router.forward(x)
        routed = self.experts(x.view(-1, x.shape[-1]), index, weights).view(*x.shape)
        return routed + self.shared(x)


@dataclass(frozen=True)
class RoutedMoe:
    """Qwen3-VL-MoE's sparse block: routed experts only, the library's router."""

    router: torch.nn.Module  # its forward is the library's
    experts: Experts

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape
        rows = x.view(-1, hidden)
        _, weights, index = self.router.forward(rows)
        return self.experts(rows, index, weights).reshape(batch, length, hidden)


def _mlp(module: torch.nn.Module):
    kind = type(module).__name__
    if kind == "DeepseekV3MoE":
        if _forward_of(module.gate) is not ungrouped_router.ungrouped_router_forward:
            raise NotDirect("the DeepSeek-V3 router chooses among expert groups (the library's forward)")
        return SharedExpertMoe(module.gate, Experts.of(module.experts), GatedMlp.of(module.shared_experts))
    if kind == "Qwen3VLMoeTextSparseMoeBlock":
        gate = module.gate
        if type(gate).__name__ != "Qwen3VLMoeTextTopKRouter" or _forward_of(gate) is not type(gate).forward:
            raise NotDirect(f"{type(gate).__name__} is not the library's Qwen3-VL-MoE router")
        return RoutedMoe(gate, Experts.of(module.experts))
    if kind in ("DeepseekV3MLP", "Qwen3VLMoeTextMLP"):
        return GatedMlp.of(module)
    raise NotDirect(f"no direct decode forward for {kind}")


@dataclass(frozen=True)
class LatentAttention:
    """mla.paged_mla_forward for decodes only, reading the pools in place (DeepSeek-V3, Kimi-K2.5)."""

    module: torch.nn.Module  # for the shared pieces: its rotary choice and the absorbed attention
    q_a: Linear | None  # None: no query LoRA, q_proj instead
    q_norm: Norm | None
    q_b: Linear  # or q_proj
    kv_a: Linear
    kv_norm: Norm
    out: Linear
    heads: int
    nope: int
    rope: int
    rank: int
    layer: int

    def __call__(self, x: torch.Tensor, rope: Rope, cache: PagedKVCache, layout: StepLayout) -> torch.Tensor:
        """x [1, n, hidden] -> [1, n, hidden]; writes the n new latents and roped keys to the pools."""
        n = x.shape[1]
        q = self.q_b(x if self.q_a is None else self.q_norm(self.q_a(x)))
        q = q.view(1, n, self.heads, self.nope + self.rope).transpose(1, 2)  # [1, H, n, Dn + Dr]
        q_nope, q_rot = torch.split(q, [self.nope, self.rope], dim=-1)
        latent, k_rot = torch.split(self.kv_a(x), [self.rank, self.rope], dim=-1)
        latent = self.kv_norm(latent).view(1, 1, n, self.rank)  # [1, 1, n, R]
        q_rot, k_rot = mla.rotary(self.module, q_rot, k_rot.view(1, 1, n, self.rope), *rope)
        cache.write(latent[0], k_rot[0], self.layer, layout.slot_mapping)
        mixed = mla.absorbed_decodes(self.module, q_nope[0], q_rot[0], None, layout)  # [n, H, Dv]
        return self.out(mixed.reshape(1, n, -1))

    @classmethod
    def of(cls, module: torch.nn.Module) -> LatentAttention:
        if _forward_of(module) is not mla.paged_mla_forward:
            raise NotDirect("the latent attention is not the engine's absorbed one")
        lora = module.q_lora_rank is not None
        return cls(module, Linear.of(module.q_a_proj) if lora else None,
                   Norm.of(module.q_a_layernorm) if lora else None,
                   Linear.of(module.q_b_proj if lora else module.q_proj), Linear.of(module.kv_a_proj_with_mqa),
                   Norm.of(module.kv_a_layernorm), Linear.of(module.o_proj), module.num_heads,
                   module.qk_nope_head_dim, module.qk_rope_head_dim, module.kv_lora_rank, module.layer_idx)


@dataclass(frozen=True)
class GroupedAttention:
    """Qwen3VLMoeTextAttention.forward with the engine's paged attention, for decodes only."""

    q: Linear
    k: Linear
    v: Linear
    out: Linear
    q_norm: Norm
    k_norm: Norm
    rotate: Callable  # the layer's own apply_rotary_pos_emb
    head_dim: int
    scale: float
    layer: int

    def __call__(self, x: torch.Tensor, rope: Rope, cache: PagedKVCache, layout: StepLayout) -> torch.Tensor:
        """x [1, n, hidden] -> [1, n, hidden]; writes the n new keys and values to the pools."""
        n = x.shape[1]
        q = self.q_norm(self.q(x).view(1, n, -1, self.head_dim)).transpose(1, 2)  # [1, Hq, n, D]
        k = self.k_norm(self.k(x).view(1, n, -1, self.head_dim)).transpose(1, 2)  # [1, Hk, n, D]
        v = self.v(x).view(1, n, -1, self.head_dim).transpose(1, 2)  # [1, Hk, n, D]
        q, k = self.rotate(q, k, *rope)
        cache.write(k[0], v[0], self.layer, layout.slot_mapping)
        out = attention.pool_decode_attention(q[0], cache.keys[self.layer], None, cache.values[self.layer], layout,
                                              self.scale)  # [n, Hq, D]
        return self.out(out.reshape(1, n, -1))

    @classmethod
    def of(cls, module: torch.nn.Module) -> GroupedAttention:
        if any(getattr(module, name).bias is not None for name in ("q_proj", "k_proj", "v_proj", "o_proj")):
            raise NotDirect("the attention's projections have biases")
        rotate = sys.modules[type(module).__module__].apply_rotary_pos_emb
        return cls(Linear.of(module.q_proj), Linear.of(module.k_proj), Linear.of(module.v_proj),
                   Linear.of(module.o_proj), Norm.of(module.q_norm), Norm.of(module.k_norm), rotate,
                   module.head_dim, module.scaling, module.layer_idx)


def _attention(module: torch.nn.Module):
    kind = type(module).__name__
    if kind == "DeepseekV3Attention":
        return LatentAttention.of(module)
    if kind == "Qwen3VLMoeTextAttention":
        return GroupedAttention.of(module)
    raise NotDirect(f"no direct decode forward for {kind}")


@dataclass(frozen=True)
class Layer:
    input_norm: Norm
    attention: LatentAttention | GroupedAttention
    post_norm: Norm
    mlp: Callable[[torch.Tensor], torch.Tensor]

    def __call__(self, h: torch.Tensor, rope: Rope, cache: PagedKVCache, layout: StepLayout) -> torch.Tensor:
        """The decoder layer's two residual blocks: h [1, n, hidden] -> [1, n, hidden]."""
        h = h + self.attention(self.input_norm(h), rope, cache, layout)
        return h + self.mlp(self.post_norm(h))


def _deepseek_positions(position_ids: torch.Tensor) -> torch.Tensor:
    return position_ids  # DeepseekV3Model hands them to its rotary embedding as they are


def _qwen_text_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """What Qwen3VLMoeTextModel.forward hands its rotary embedding: the three M-RoPE rows (a leading
    text row dropped, one row repeated thrice)."""
    if position_ids.ndim == 2:
        return position_ids[None, ...].expand(3, position_ids.shape[0], -1)
    if position_ids.ndim == 3 and position_ids.shape[0] == 4:
        return position_ids[1:]
    return position_ids


TEXT_MODELS = {"DeepseekV3Model": _deepseek_positions, "Qwen3VLMoeTextModel": _qwen_text_positions}


@dataclass(frozen=True)
class DirectDecode:
    embedding: torch.nn.Embedding
    rotary: torch.nn.Module
    positions: Callable[[torch.Tensor], torch.Tensor]
    layers: tuple[Layer, ...]
    norm: Norm
    head: Linear
    placeholder_ids: frozenset[int]  # tokens the module path embeds as another id (Kimi's image/video ids)

    def takes(self, token_ids: list[int]) -> bool:
        """Whether a decode-only step of these tokens can run here (else the modules run it); pure."""
        return self.placeholder_ids.isdisjoint(token_ids)

    def __call__(self, input_ids: torch.Tensor, position_ids: torch.Tensor, cache: PagedKVCache,
                 layout: StepLayout, keep: torch.Tensor) -> torch.Tensor:
        """input_ids [1, n], position_ids as the model takes them, keep [k] -> logits [1, k, vocab]."""
        e = self.embedding
        h = F.embedding(input_ids, e.weight, e.padding_idx)  # [1, n, hidden]
        rope = self.rotary(h, self.positions(position_ids))
        for layer in self.layers:
            h = layer(h, rope, cache, layout)
        return self.head(self.norm(h)[:, keep, :])

    @classmethod
    def build(cls, model: torch.nn.Module) -> DirectDecode:
        """The direct forward of an engine's language model (`model`: its ForConditionalGeneration);
        NotDirect where a part is not one this file covers."""
        text = getattr(getattr(model, "model", None), "language_model", None)
        positions = TEXT_MODELS.get(type(text).__name__)
        if positions is None:
            raise NotDirect(f"no direct decode forward for {type(text).__name__}")
        if type(text.embed_tokens) is not torch.nn.Embedding or text.embed_tokens.max_norm is not None:
            raise NotDirect("the token embedding is not a plain nn.Embedding")
        config = model.config
        placeholders = frozenset(getattr(config, name) for name in ("image_token_id", "video_token_id")
                                 if getattr(config, name, None) is not None)
        layers = tuple(Layer(Norm.of(layer.input_layernorm), _attention(layer.self_attn),
                             Norm.of(layer.post_attention_layernorm), _mlp(layer.mlp))
                       for layer in text.layers[:text.config.num_hidden_layers])  # as the text model loops
        return cls(text.embed_tokens, text.rotary_emb, positions, layers, Norm.of(text.norm), Linear.of(model.lm_head),
                   placeholders)
