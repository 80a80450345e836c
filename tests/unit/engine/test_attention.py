"""The attention pieces against attention written out by hand (model-free, small random tensors)."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from epd.engine.attention import causal_chunk_mask, prefill_attention


def _reference(query, key, value, mask, scale):
    """softmax(q k^T * scale, masked) v, in float64: query [H, q, Dk], key [H, kv, Dk], value [H, kv, Dv]."""
    scores = query.double() @ key.double().transpose(-1, -2) * scale  # [H, q, kv]
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ value.double()  # [H, q, Dv]


def test_causal_chunk_mask_puts_the_queries_at_the_end_of_their_context():
    assert causal_chunk_mask(2, 5).tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


@pytest.mark.parametrize("past", [0, 3])
@pytest.mark.parametrize("v_dim", [64, 96])
def test_prefill_attention_with_narrower_values_equals_the_written_out_attention(past, v_dim):
    torch.manual_seed(0)
    heads, q_len, k_dim, scale = 4, 7, 96, 0.125
    kv_len = past + q_len
    query = torch.randn(heads, q_len, k_dim)
    key, value = torch.randn(heads, kv_len, k_dim), torch.randn(heads, kv_len, v_dim)
    mask = causal_chunk_mask(q_len, kv_len)
    out = prefill_attention(query, key, value, mask if past else None, scale)
    assert out.shape == (heads, q_len, v_dim)
    torch.testing.assert_close(out.double(), _reference(query, key, value, mask, scale), atol=1e-5, rtol=1e-5)


def test_prefill_attention_with_grouped_heads_equals_the_expanded_heads():
    torch.manual_seed(1)
    query, key, value = torch.randn(1, 8, 5, 32), torch.randn(1, 2, 5, 32), torch.randn(1, 2, 5, 16)
    out = prefill_attention(query, key, value, None, None, gqa=True)
    expanded = prefill_attention(query, key.repeat_interleave(4, 1), value.repeat_interleave(4, 1), None, None)
    torch.testing.assert_close(out, expanded)
    assert out.shape == (1, 8, 5, 16)


def test_values_narrower_than_keys_still_take_the_flash_kernel():
    """The reason for the padding: the math fallback materialises every score (3x slower on MLA prompts)."""
    query, key, value = torch.randn(8, 64, 96), torch.randn(8, 64, 96), torch.randn(8, 64, 64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        prefill_attention(query, key, value, None, 0.1)
    kernels = {event.key for event in prof.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in kernels
    assert "aten::_scaled_dot_product_attention_math" not in kernels


def test_decodes_read_in_place_equal_decodes_read_from_a_gather():
    """One step (three decodes, then a prefill chunk with a past) through the cache and the attention
    twice: every context gathered (torch path), and the decodes read from the pool by the native kernel
    (kv_index then holds only the prefill's context, which starts at 0)."""
    from types import SimpleNamespace

    from epd.engine.attention import PrefillSegment, StepLayout, paged_attention
    from epd.engine.model_runner import decode_contexts
    from epd.engine.paged_cache import LayerShape, PagedKVCache
    from epd.kernels.native import load_kernels

    assert load_kernels().ok
    torch.manual_seed(2)
    cache = PagedKVCache([LayerShape(heads=2, key_dim=16, value_dim=16)], num_blocks=10, block_size=4)
    cache.keys[0][:, 4:].normal_()
    cache.values[0][:, 4:].normal_()
    lengths = [10, 3, 6]
    contexts, mask = decode_contexts([[1, 2, 3], [4], [5, 6]], lengths, 4, 10)  # [3, 10], [3, 1, 10]
    prefill_context = torch.arange(28, 35)  # blocks 7, 8: a past of 3 tokens and a chunk of 4
    new_slots = torch.cat([contexts[torch.arange(3), torch.tensor(lengths) - 1], prefill_context[3:]])  # [7]
    query, new_keys, new_values = torch.randn(1, 4, 7, 16), torch.randn(1, 2, 7, 16), torch.randn(1, 2, 7, 16)
    chunk_mask = causal_chunk_mask(4, 7)
    layouts = {
        "gathered": StepLayout(new_slots, torch.cat([contexts.reshape(-1), prefill_context]), 3, 10, mask,
                               (PrefillSegment(3, 4, 30, 7, chunk_mask),)),
        "in place": StepLayout(new_slots, prefill_context, 3, 10, mask, (PrefillSegment(3, 4, 0, 7, chunk_mask),),
                               decode_slots=contexts, decode_lengths=torch.tensor(lengths), pool=cache),
    }
    out = {}
    for name, layout in layouts.items():
        keys, values = cache.update(new_keys, new_values, 0, {"epd_layout": layout})
        assert keys.shape[2] == (37 if name == "gathered" else 7)
        out[name], _ = paged_attention(SimpleNamespace(layer_idx=0), query, keys, values, None, epd_layout=layout)
    assert out["in place"].shape == (1, 7, 4, 16)
    torch.testing.assert_close(out["in place"], out["gathered"], atol=1e-5, rtol=1e-5)


def _segment(samples: bool):
    from epd.engine.attention import PrefillSegment

    return PrefillSegment(q_start=3, q_len=4, kv_start=30, kv_len=7, mask=causal_chunk_mask(4, 7), samples=samples)


def test_chunk_queries_are_every_row_except_in_the_sampled_only_layer():
    from epd.engine.attention import StepLayout, chunk_queries

    empty = torch.empty(0, dtype=torch.long)
    layout = StepLayout(empty, empty, 0, 0, None, (), sampled_only_layer=5)
    for layer in (None, 0, 4):
        every = chunk_queries(_segment(True), layout, layer)
        assert every.rows == slice(3, 7) and every.causal and torch.equal(every.mask, causal_chunk_mask(4, 7))
    last = chunk_queries(_segment(True), layout, 5)
    assert (last.rows, last.mask, last.causal) == (slice(6, 7), None, False)  # the last row sees all 7 keys
    assert chunk_queries(_segment(False), layout, 5) is None  # a chunk that does not sample: no row read


def test_the_sampled_only_layer_computes_the_decodes_and_each_sampling_chunks_last_row():
    """One step of two decodes and two chunks (the first samples, the second does not), through
    paged_attention twice: every row, and as the last layer (rows read: the decodes, the first chunk's
    last row). Those rows equal the full layer's; the rest are zeros."""
    from types import SimpleNamespace

    from epd.engine.attention import PrefillSegment, StepLayout, paged_attention

    torch.manual_seed(3)
    # keys: two decodes with padded contexts of 5, then chunk A (past 2 + 3 new), then chunk B (4, no past)
    decode_mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2]).unsqueeze(1)  # [2, 1, 5]
    segments = (PrefillSegment(2, 3, 10, 5, causal_chunk_mask(3, 5), samples=True),
                PrefillSegment(5, 4, 15, 4, None, samples=False))
    query, key, value = torch.randn(1, 4, 9, 16), torch.randn(1, 2, 19, 16), torch.randn(1, 2, 19, 8)
    empty = torch.empty(0, dtype=torch.long)
    out = {}
    for name, layer in (("every row", None), ("sampled only", 1)):
        layout = StepLayout(empty, empty, 2, 5, decode_mask, segments, sampled_only_layer=layer)
        out[name], _ = paged_attention(SimpleNamespace(layer_idx=1), query, key, value, None, epd_layout=layout)
    read = [0, 1, 4]
    torch.testing.assert_close(out["sampled only"][0, read], out["every row"][0, read], atol=1e-6, rtol=1e-6)
    assert out["sampled only"][0, [2, 3, 5, 6, 7, 8]].abs().max() == 0
