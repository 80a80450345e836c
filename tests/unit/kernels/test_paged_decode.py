"""The native paged decode attention (epd/kernels/paged_decode.cpp) against a per-sequence reference,
and its refusals. Model-free; the kernel is built here as a worker builds it (a C++ compiler and
ninja are part of the test machine, as they are of `scripts/setup.sh`'s)."""

from __future__ import annotations

import pytest
import torch

from epd.engine.native_kernels import reference_paged_decode
from epd.kernels.native import load_kernels


@pytest.fixture(scope="module", autouse=True)
def kernel():
    built = load_kernels()
    assert built.ok, built.detail


def _case(heads, kv_heads, dim_a, dim_b, dim_v, lengths, dtype, seed=0, shared_value=False):
    """Pools of 16 blocks of 16 slots (slot order shuffled), contexts padded to the longest with slot 0."""
    gen = torch.Generator().manual_seed(seed)
    total = 16 * 16
    key_a = torch.randn(kv_heads, total, dim_a, generator=gen).to(dtype)
    key_b = torch.randn(kv_heads, total, dim_b, generator=gen).to(dtype) if dim_b else None
    value = key_a if shared_value else torch.randn(kv_heads, total, dim_v, generator=gen).to(dtype)
    width = max(lengths)
    order = torch.randperm(total - 1, generator=gen) + 1  # slot 0 stays the padding
    slots = torch.zeros(len(lengths), width, dtype=torch.long)
    used = 0
    for i, length in enumerate(lengths):
        slots[i, :length] = order[used:used + length]
        used += length
    query = torch.randn(len(lengths), heads, dim_a + dim_b, generator=gen).to(dtype)
    return query, key_a, key_b, value, slots, torch.tensor(lengths)


SHAPES = {  # heads, kv_heads, dim_a, dim_b, dim_v, values are key_a
    "grouped heads (Qwen3-VL small)": (8, 4, 64, 0, 64, False),
    "latent attention (Kimi small: [latent | roped key], values = latent)": (8, 1, 128, 32, 128, True),
    "widths not a multiple of 16 (Kimi tiny)": (4, 1, 32, 8, 32, True),
    "odd widths, one head per key head": (3, 3, 24, 0, 20, False),
    "12 heads per key head: scored as 8 and 4": (12, 1, 32, 0, 32, False),
}


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 2e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_equals_the_reference(shape, dtype, tolerance):
    heads, kv_heads, dim_a, dim_b, dim_v, shared = shape
    query, key_a, key_b, value, slots, lengths = _case(heads, kv_heads, dim_a, dim_b, dim_v, [1, 17, 40, 33],
                                                       dtype, shared_value=shared)
    got = torch.ops.epd.paged_decode(query, key_a, key_b, value, slots, lengths, 0.3)
    assert got.shape == (4, heads, value.shape[-1]) and got.dtype == dtype
    want = reference_paged_decode(query, key_a, key_b, value, slots, lengths, 0.3)
    torch.testing.assert_close(got.float(), want, atol=tolerance, rtol=tolerance)


def test_reads_nothing_past_a_context_end():
    """Slots past each length may point anywhere (here at NaNs): they never reach the output."""
    query, key_a, _, value, slots, lengths = _case(4, 2, 16, 0, 16, [5, 12], torch.float32)
    key_a[:, 0], value[:, 0] = float("nan"), float("nan")
    slots[0, 5:] = 0  # sequence 0's padding at the NaN slot
    got = torch.ops.epd.paged_decode(query, key_a, None, value, slots, lengths, 0.25)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, reference_paged_decode(query, key_a, None, value, slots, lengths, 0.25))


def test_two_threads_give_the_same_bits_as_one():
    """Each (sequence, key head) is one job: how jobs are split over threads cannot change a bit."""
    case = _case(8, 4, 64, 0, 64, [30, 7, 64, 50, 2, 19], torch.bfloat16, seed=3)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.epd.paged_decode(*case, 0.125)
        torch.set_num_threads(2)
        two = torch.ops.epd.paged_decode(*case, 0.125)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def _refusal(**changes) -> str:
    query, key_a, key_b, value, slots, lengths = _case(4, 2, 16, 0, 16, [3, 9], torch.float32)
    args = dict(query=query, key_a=key_a, key_b=key_b, value=value, slots=slots, lengths=lengths, scale=0.5)
    args.update(changes)
    with pytest.raises(RuntimeError) as caught:
        torch.ops.epd.paged_decode(*args.values())
    return str(caught.value)


def test_refuses_a_slot_outside_the_pool():
    slots = torch.tensor([[1, 2, 3, 0, 0, 0, 0, 0, 0], [4, 5, 6, 7, 8, 9, 10, 11, 16 * 16]])
    assert "slot 256 is outside the pool of 256" in _refusal(slots=slots)


def test_refuses_a_length_outside_the_context():
    assert "lengths[0] = 0 is outside 1..9" in _refusal(lengths=torch.tensor([0, 9]))
    assert "lengths[1] = 10 is outside 1..9" in _refusal(lengths=torch.tensor([3, 10]))


def test_refuses_mixed_and_unsupported_dtypes():
    query, key_a, _, value, *_ = _case(4, 2, 16, 0, 16, [3, 9], torch.float32)
    assert "value is BFloat16, query Float" in _refusal(value=value.bfloat16())
    assert "supports float32 and bfloat16, not Half" in _refusal(query=query.half(), key_a=key_a.half(),
                                                                  value=value.half())


def test_refuses_heads_that_do_not_group():
    query, *_ = _case(3, 2, 16, 0, 16, [3, 9], torch.float32)
    assert "query heads 3 are not a multiple of key heads 2" in _refusal(query=query)
