"""The native MoE combine (epd/kernels/moe.cpp) against the library's formula (epd.models.experts._combine,
which is transformers' grouped forward's last four operators) bit for bit, and its refusals. Model-free."""

from __future__ import annotations

import pytest
import torch

from epd.kernels.native import load_kernels
from epd.models.experts import _combine, _native_combine, _sums_in_order


@pytest.fixture(scope="module", autouse=True)
def kernels():
    built = load_kernels()
    assert built.ok, built.detail


def _case(rows: int, width: int, tokens: int, top_k: int, dtype: torch.dtype, weight_dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    out = (torch.randn(rows, width, generator=gen) * 3).to(dtype)  # [R, H]: the experts' products
    index = torch.randint(0, rows, (tokens, top_k), generator=gen)  # [T, k]: each pair's row
    weights = torch.softmax(torch.randn(tokens, top_k, generator=gen), dim=-1).to(weight_dtype)  # [T, k]
    return out, index, weights


@pytest.mark.parametrize("dtype, weight_dtype", [(torch.bfloat16, torch.bfloat16),  # Qwen in bfloat16
                                                 (torch.bfloat16, torch.float32),  # Kimi's router in bfloat16
                                                 (torch.float32, torch.float32)])
@pytest.mark.parametrize("tokens, top_k, width", [(1, 4, 512), (37, 8, 96), (300, 2, 21)],
                         ids=["a decode", "top-8", "an odd width"])
def test_equals_the_library_bit_for_bit(dtype, weight_dtype, tokens, top_k, width):
    out, index, weights = _case(rows=3 * tokens * top_k, width=width, tokens=tokens, top_k=top_k, dtype=dtype,
                                weight_dtype=weight_dtype)
    got = torch.ops.epd.moe_combine(out, index, weights)
    want = _combine(out, index, weights, dtype)
    assert got.dtype == dtype and got.shape == (tokens, width)
    assert torch.equal(got, want)


def test_bfloat16_products_are_rounded_before_the_sum():
    # 1 + 2^-8 is not a bfloat16 (its 7 fraction bits end at 2^-7): the library's product of it and 1
    # rounds to 1 before the sum; summing unrounded would give 2 + 2^-7, a different bfloat16.
    out = torch.tensor([[1.0], [1.0]], dtype=torch.bfloat16)
    weights = torch.tensor([[1.0, 1.0 + 2 ** -8 + 2 ** -12]]).to(torch.bfloat16)
    index = torch.tensor([[0, 1]])
    assert torch.equal(torch.ops.epd.moe_combine(out, index, weights), _combine(out, index, weights, torch.bfloat16))


def test_two_threads_give_the_bits_of_one():
    out, index, weights = _case(rows=4000, width=512, tokens=1000, top_k=4, dtype=torch.bfloat16,
                                weight_dtype=torch.bfloat16)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.epd.moe_combine(out, index, weights)
        torch.set_num_threads(2)
        two = torch.ops.epd.moe_combine(out, index, weights)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)


def test_refusals_say_what_is_wrong():
    out, index, weights = _case(rows=10, width=8, tokens=3, top_k=2, dtype=torch.float32, weight_dtype=torch.float32)
    with pytest.raises(RuntimeError, match=r"index\[1, 0\] = 10 is outside the 10 rows"):
        torch.ops.epd.moe_combine(out, torch.tensor([[0, 1], [10, 2], [3, 4]]), weights)
    with pytest.raises(RuntimeError, match="is outside the 10 rows"):
        torch.ops.epd.moe_combine(out, torch.tensor([[0, 1], [-1, 2], [3, 4]]), weights)
    with pytest.raises(RuntimeError, match="expected the index's"):
        torch.ops.epd.moe_combine(out, index, weights[:, :1].contiguous())
    with pytest.raises(RuntimeError, match="int64"):
        torch.ops.epd.moe_combine(out, index.int(), weights)
    with pytest.raises(RuntimeError, match="not Half rows with Half weights"):
        torch.ops.epd.moe_combine(out.half(), index, weights.half())
    with pytest.raises(RuntimeError, match="float32 rows with float32 weights"):
        torch.ops.epd.moe_combine(out, index, weights.bfloat16())


@pytest.mark.parametrize("top_k", [1, 2, 4, 5, 8, 9])
def test_the_kernel_is_used_only_where_torch_sums_in_order(top_k):
    # The rule checked against torch itself: where it says in order, torch's sum is the sequential one.
    for width in (1, 7, 21, 32, 48, 96, 130, 512):
        rows = torch.randn(33, top_k, width, generator=torch.Generator().manual_seed(width))  # [T, k, H]
        in_order = rows[:, 0].clone()
        for j in range(1, top_k):
            in_order += rows[:, j]
        if _sums_in_order(top_k, width):
            assert torch.equal(rows.sum(dim=1), in_order), (top_k, width)
    # Elsewhere the library's operators run, with their own order.
    out, index, weights = _case(rows=100, width=48, tokens=20, top_k=8, dtype=torch.float32, weight_dtype=torch.float32)
    assert not _sums_in_order(8, 48)
    want = _combine(out, index, weights, torch.float32)
    assert torch.equal(_native_combine(out, index, weights, torch.float32), want)
