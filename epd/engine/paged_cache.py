"""The KV block pool, and the object passed to the model as `cache=`.

Each layer owns two pools, `[H, num_blocks * block_size, D]`: "keys" and "values" as the layer
hands them to its cache — per-head K and V for GQA (Qwen3-VL-MoE), the normalised latent and the
roped key for MLA (Kimi-K2.5 / DeepSeek-V3: `[1, kv_lora_rank]` and `[1, qk_rope_head_dim]`).
Slot `b * block_size + i` is token i of block b; block 0 stays zero (padding points at it). Heads
come first so that a gather returns each head's keys contiguous, as the attention's matmuls want.

`update` writes the step's new tokens at their slots and returns every context the step's
attention needs, gathered in the layout's order (see attention.py). Shapes are discovered by one
probe forward at start, so any family whose layers call `cache.update(k, v, layer_idx, kwargs)`
works without a per-family table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

NamedTensors = list[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class LayerShape:
    heads: int  # heads of what the layer caches (1 for MLA latents)
    key_dim: int
    value_dim: int


def probe_layer_shapes(model: torch.nn.Module, forward_kwargs: dict) -> list[LayerShape]:
    """Run one tiny forward with a recording cache; returns what each layer caches, in layer order."""
    shapes: dict[int, LayerShape] = {}

    class _Probe(DynamicCache):
        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            shapes[layer_idx] = LayerShape(key_states.shape[1], key_states.shape[-1], value_states.shape[-1])
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    with torch.inference_mode():
        model(cache=_Probe(), use_cache=True, **forward_kwargs)
    if sorted(shapes) != list(range(len(shapes))) or not shapes:
        raise RuntimeError(f"the probe forward cached layers {sorted(shapes)}; expected 0..N-1")
    return [shapes[i] for i in range(len(shapes))]


def bytes_per_block(shapes: list[LayerShape], block_size: int, dtype: torch.dtype) -> int:
    item = torch.empty((), dtype=dtype).element_size()
    return sum(block_size * s.heads * (s.key_dim + s.value_dim) * item for s in shapes)


class PagedKVCache:
    def __init__(self, shapes: list[LayerShape], num_blocks: int, block_size: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        self.shapes = shapes
        self.num_blocks = num_blocks
        self.block_size = block_size
        slots = num_blocks * block_size
        # torch.empty: pages are committed as blocks are first written, not all at start.
        self.keys = [torch.empty(s.heads, slots, s.key_dim, dtype=dtype, device=device) for s in shapes]
        self.values = [torch.empty(s.heads, slots, s.value_dim, dtype=dtype, device=device) for s in shapes]
        for pool in (*self.keys, *self.values):
            pool[:, :block_size].zero_()  # the null block

    @property
    def device(self) -> torch.device:
        """Where the pool lives (the worker's --device)."""
        return self.keys[0].device

    @property
    def num_layers(self) -> int:
        return len(self.shapes)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               kwargs: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """key/value_states [1, H, T, D] -> the step's contexts [1, H, K, D] (see StepLayout)."""
        layout = (kwargs or {}).get("epd_layout")
        if layout is None:
            raise RuntimeError("PagedKVCache.update needs the engine's step layout (epd_layout=...)")
        self.write(key_states[0], value_states[0], layer_idx, layout.slot_mapping)
        past_keys = self.keys[layer_idx].index_select(1, layout.kv_index)  # [H, K, Dk]
        past_values = self.values[layer_idx].index_select(1, layout.kv_index)  # [H, K, Dv]
        return past_keys.unsqueeze(0), past_values.unsqueeze(0)

    def write(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, slots: torch.Tensor) -> None:
        """keys [H, T, Dk] and values [H, T, Dv] of T new tokens into layer `layer_idx`'s pools at `slots` [T]."""
        self.keys[layer_idx].index_copy_(1, slots, keys)
        self.values[layer_idx].index_copy_(1, slots, values)

    # --- moving a sequence's KV between workers --------------------------------------------------

    def export_blocks(self, block_ids: list[int]) -> NamedTensors:
        """Copies of the given blocks, per layer: `layer.{i}.keys` [n, block_size, H, Dk] and `.values`."""
        index = torch.tensor(block_ids, dtype=torch.long, device=self.keys[0].device)
        tensors: NamedTensors = []
        for i, (keys, values) in enumerate(zip(self.keys, self.values, strict=True)):
            for kind, pool in (("keys", keys), ("values", values)):
                blocks = self._blocks(pool).index_select(1, index)  # [H, n, bs, D]
                tensors.append((f"layer.{i}.{kind}", blocks.permute(1, 2, 0, 3).contiguous()))  # [n, bs, H, D]
        return tensors

    def import_tokens(self, tensors: NamedTensors, num_tokens: int, slots: torch.Tensor) -> None:
        """Write `export_blocks` output (any source block size) for tokens 0..num_tokens-1 at `slots`."""
        by_name = dict(tensors)
        for i, (keys, values) in enumerate(zip(self.keys, self.values, strict=True)):
            for kind, pool in (("keys", keys), ("values", values)):
                data = by_name[f"layer.{i}.{kind}"]  # [n, bs, H, D]
                flat = data.reshape(-1, *data.shape[2:])[:num_tokens]  # [num_tokens, H, D]
                pool.index_copy_(1, slots.to(pool.device), flat.transpose(0, 1).to(pool.device, pool.dtype))

    def check_import(self, tensors: NamedTensors, num_tokens: int) -> None:
        """ValueError naming what does not fit this pool: layer count, names, shapes, token count."""
        names = [name for name, _ in tensors]
        expected = [f"layer.{i}.{kind}" for i in range(self.num_layers) for kind in ("keys", "values")]
        if sorted(names) != sorted(expected):
            raise ValueError(f"KV tensors must be keys/values for {self.num_layers} layers "
                             f"(layer.0.keys ...), got {names[:6]}{'...' if len(names) > 6 else ''}")
        by_name = dict(tensors)
        for i, shape in enumerate(self.shapes):
            for kind, dim in (("keys", shape.key_dim), ("values", shape.value_dim)):
                data = by_name[f"layer.{i}.{kind}"]
                if data.ndim != 4 or tuple(data.shape[2:]) != (shape.heads, dim):
                    raise ValueError(f"layer.{i}.{kind} has shape {tuple(data.shape)}; this model caches "
                                     f"[blocks, block_size, {shape.heads}, {dim}]")
                if data.shape[0] * data.shape[1] < num_tokens:
                    raise ValueError(f"layer.{i}.{kind} holds {data.shape[0] * data.shape[1]} slots "
                                     f"for {num_tokens} tokens")

    def _blocks(self, pool: torch.Tensor) -> torch.Tensor:
        return pool.view(pool.shape[0], self.num_blocks, self.block_size, pool.shape[2])  # [H, blocks, bs, D]
