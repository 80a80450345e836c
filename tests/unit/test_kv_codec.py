"""export_kv / import_kv: a filled DynamicCache as named [heads, T, dim] tensors and back, with Dk != Dv."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache, LlamaConfig

from epd.engine.kv import export_kv, import_kv

LAYERS, HEADS, T, DK, DV = 3, 2, 5, 8, 4


def config(num_layers: int = LAYERS) -> LlamaConfig:
    # Building a config loads no weights; DynamicCache(config=...) only reads its layer layout.
    return LlamaConfig(num_hidden_layers=num_layers, hidden_size=16, num_attention_heads=HEADS,
                       num_key_value_heads=HEADS, intermediate_size=32, vocab_size=64)


def filled_cache(layers: int = LAYERS, tokens: int = T) -> tuple[DynamicCache, list[tuple[torch.Tensor, torch.Tensor]]]:
    gen = torch.Generator().manual_seed(0)
    cache, kv = DynamicCache(), []
    for i in range(layers):
        k = torch.randn(1, HEADS, tokens, DK, generator=gen)
        v = torch.randn(1, HEADS, tokens, DV, generator=gen)
        cache.update(k, v, i)
        kv.append((k, v))
    return cache, kv


def exported() -> list[tuple[str, torch.Tensor]]:
    return export_kv(filled_cache()[0])


def test_export_names_in_layer_order():
    assert [name for name, _ in exported()] == [
        "layer.0.keys", "layer.0.values", "layer.1.keys", "layer.1.values", "layer.2.keys", "layer.2.values"]


def test_export_drops_the_batch_dimension_and_keeps_distinct_head_dims():
    shapes = [tuple(t.shape) for _, t in exported()]
    assert shapes == [(HEADS, T, DK), (HEADS, T, DV)] * LAYERS


def test_export_values_equal_the_cache_and_are_contiguous():
    cache, kv = filled_cache()
    tensors = export_kv(cache)
    for i, (k, v) in enumerate(kv):
        assert torch.equal(tensors[2 * i][1], k[0])
        assert torch.equal(tensors[2 * i + 1][1], v[0])
    assert all(t.is_contiguous() for _, t in tensors)


def test_export_of_a_non_contiguous_layer_is_contiguous():
    cache = DynamicCache()
    k = torch.randn(1, T, HEADS, DK).transpose(1, 2)  # [1, H, T, Dk], not contiguous
    cache.update(k, torch.randn(1, HEADS, T, DV), 0)
    keys = export_kv(cache)[0][1]
    assert keys.is_contiguous() and torch.equal(keys, k[0])


def test_export_refuses_a_batch_of_two():
    cache = DynamicCache()
    cache.update(torch.zeros(2, HEADS, T, DK), torch.zeros(2, HEADS, T, DV), 0)
    with pytest.raises(ValueError, match="layer 0: expected a filled cache of one sequence"):
        export_kv(cache)


def test_export_of_an_empty_cache_is_empty():
    assert export_kv(DynamicCache()) == []


def test_round_trip_gives_equal_tensors_and_the_length():
    cache, kv = filled_cache()
    rebuilt, length = import_kv(export_kv(cache), config())
    assert length == T
    assert rebuilt.get_seq_length() == T
    assert len(rebuilt.layers) == LAYERS
    for layer, (k, v) in zip(rebuilt.layers, kv, strict=True):
        assert layer.keys.shape == (1, HEADS, T, DK) and torch.equal(layer.keys, k)
        assert layer.values.shape == (1, HEADS, T, DV) and torch.equal(layer.values, v)


def test_round_trip_twice_is_stable():
    cache, _ = filled_cache()
    once = export_kv(cache)
    twice = export_kv(import_kv(once, config())[0])
    assert [n for n, _ in twice] == [n for n, _ in once]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(once, twice, strict=True))


def test_import_accepts_any_tensor_order():
    cache, kv = filled_cache()
    rebuilt, length = import_kv(list(reversed(export_kv(cache))), config())
    assert length == T
    assert all(torch.equal(layer.keys, k) for layer, (k, _) in zip(rebuilt.layers, kv, strict=True))


def test_import_of_one_token_gives_length_one():
    rebuilt, length = import_kv(export_kv(filled_cache(tokens=1)[0]), config())
    assert length == 1 and rebuilt.get_seq_length() == 1


def test_rebuilt_cache_keeps_growing_on_update():
    rebuilt, _ = import_kv(exported(), config())
    rebuilt.update(torch.zeros(1, HEADS, 1, DK), torch.zeros(1, HEADS, 1, DV), 0)
    assert rebuilt.get_seq_length(0) == T + 1


# --- malformed input -------------------------------------------------------------------------------------


def test_import_refuses_an_odd_count():
    tensors = exported()[:-1]
    with pytest.raises(ValueError, match="keys/values pairs per layer") as info:
        import_kv(tensors, config())
    assert "layer.2.keys" in str(info.value)  # the message lists the names it got


def test_import_refuses_nothing():
    with pytest.raises(ValueError, match="keys/values pairs per layer"):
        import_kv([], config())


def test_import_refuses_duplicate_names():
    tensors = exported()
    tensors[3] = ("layer.0.keys", tensors[3][1])  # layer.1.values replaced by a second layer.0.keys
    with pytest.raises(ValueError, match="keys/values pairs per layer"):
        import_kv(tensors, config())


def test_import_refuses_a_missing_layer():
    tensors = [(n.replace("layer.1.", "layer.7."), t) for n, t in exported()]
    with pytest.raises(ValueError, match=r"KV tensors lack 'layer\.1\.keys'"):
        import_kv(tensors, config())


def test_import_refuses_a_misnamed_tensor():
    tensors = exported()
    tensors[1] = ("layer.0.vals", tensors[1][1])
    with pytest.raises(ValueError, match=r"KV tensors lack 'layer\.0\.values'"):
        import_kv(tensors, config())


def test_import_refuses_a_different_length_in_a_later_layer():
    tensors = exported()
    tensors[4] = ("layer.2.keys", torch.zeros(HEADS, T + 1, DK))
    tensors[5] = ("layer.2.values", torch.zeros(HEADS, T + 1, DV))
    with pytest.raises(ValueError, match=f"layer 2 holds {T + 1} tokens, layer 0 holds {T}"):
        import_kv(tensors, config())


def test_import_refuses_keys_and_values_of_different_lengths():
    tensors = exported()
    tensors[3] = ("layer.1.values", torch.zeros(HEADS, T - 1, DV))
    with pytest.raises(ValueError) as info:
        import_kv(tensors, config())
    assert str(info.value) == (f"layer 1: keys ({HEADS}, {T}, {DK}) and values ({HEADS}, {T - 1}, {DV}) "
                               "must both be [heads, T, dim] with the same heads and T")


@pytest.mark.parametrize("index, shape", [(0, (1, HEADS, T, DK)), (1, (HEADS * T * DV,)), (2, (HEADS, T, DK, 1))])
def test_import_refuses_the_wrong_ndim(index, shape):
    tensors = exported()
    tensors[index] = (tensors[index][0], torch.zeros(shape))
    with pytest.raises(ValueError, match=r"must both be \[heads, T, dim\]"):
        import_kv(tensors, config())


def test_import_refuses_keys_and_values_with_different_head_counts():
    tensors = exported()
    tensors[1] = ("layer.0.values", torch.zeros(HEADS + 1, T, DV))
    with pytest.raises(ValueError):
        import_kv(tensors, config())


def test_import_refuses_more_layers_than_the_config_has():
    with pytest.raises(ValueError):
        import_kv(exported(), config(num_layers=LAYERS - 1))


def test_import_refuses_fewer_layers_than_the_config_has():
    with pytest.raises(ValueError):
        import_kv(exported(), config(num_layers=LAYERS + 1))
