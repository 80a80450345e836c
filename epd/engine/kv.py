"""KV cache export and import: a prefilled DynamicCache as named tensors for the transfer layer.

Each layer's keys and values leave as `[heads, T, head_dim]` tensors (the batch row dropped) named
`layer.{i}.keys` / `layer.{i}.values`, in layer order; the decode side rebuilds the cache layer by
layer. Key and value head dims may differ (DeepSeek-V3 MLA caches [nope | rope] keys, smaller values).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PretrainedConfig

NamedTensors = list[tuple[str, torch.Tensor]]


def export_kv(cache: DynamicCache) -> NamedTensors:
    """The cache's per-layer keys and values, contiguous, without the batch dimension."""
    tensors: NamedTensors = []
    for index, layer in enumerate(cache.layers):
        if layer.keys is None or layer.keys.shape[0] != 1:
            raise ValueError(f"layer {index}: expected a filled cache of one sequence")
        tensors.append((f"layer.{index}.keys", layer.keys[0].contiguous()))  # [heads, T, Dk]
        tensors.append((f"layer.{index}.values", layer.values[0].contiguous()))  # [heads, T, Dv]
    return tensors


def import_kv(tensors: NamedTensors, config: PretrainedConfig) -> tuple[DynamicCache, int]:
    """Rebuild a DynamicCache from `export_kv`'s tensors; returns (cache, number of cached tokens)."""
    by_name = dict(tensors)
    num_layers = len(tensors) // 2
    if len(tensors) != 2 * num_layers or len(by_name) != len(tensors) or num_layers == 0:
        raise ValueError(f"KV tensors must be keys/values pairs per layer, got names {[n for n, _ in tensors]}")
    expected_layers = getattr(config.get_text_config(), "num_hidden_layers", None)
    if expected_layers is not None and num_layers != expected_layers:
        raise ValueError(f"KV has {num_layers} layers; the model has {expected_layers}")
    cache = DynamicCache(config=config)
    length = None
    for index in range(num_layers):
        try:
            keys, values = by_name[f"layer.{index}.keys"], by_name[f"layer.{index}.values"]
        except KeyError as missing:
            raise ValueError(f"KV tensors lack {missing.args[0]!r}") from None
        if keys.ndim != 3 or values.ndim != 3 or keys.shape[:2] != values.shape[:2]:
            raise ValueError(f"layer {index}: keys {tuple(keys.shape)} and values {tuple(values.shape)} "
                             "must both be [heads, T, dim] with the same heads and T")
        if length is not None and keys.shape[1] != length:
            raise ValueError(f"layer {index} holds {keys.shape[1]} tokens, layer 0 holds {length}")
        length = int(keys.shape[1])
        cache.update(keys.unsqueeze(0), values.unsqueeze(0), index)  # [1, heads, T, D]
    return cache, length
