"""The native in-place row softmax with masked tail columns (epd/kernels/softmax_rows.cpp) against a
float64 softmax and ATen's float32 one; its refusals. Model-free."""

from __future__ import annotations

import pytest
import torch

from epd.kernels.native import load_kernels


@pytest.fixture(scope="module", autouse=True)
def kernels():
    built = load_kernels()
    assert built.ok, built.detail


def _scores(rows: int, columns: int) -> torch.Tensor:
    return torch.randn(rows, columns, generator=torch.Generator().manual_seed(rows * 1000 + columns)) * 6


# columns: under a vector, a vector and a tail, the vision towers' 784 and 1024 patches; valid < columns: padded keys
@pytest.mark.parametrize(("rows", "columns", "valid"), [(1, 1, 1), (3, 7, 7), (5, 37, 37), (9, 37, 30),
                                                         (40, 784, 784), (33, 1024, 1000), (2, 64, 1)])
def test_each_rows_valid_columns_are_their_softmax_and_the_rest_zero(rows, columns, valid):
    x = _scores(rows, columns)
    exact = torch.softmax(x[:, :valid].double(), dim=-1)
    aten = torch.softmax(x[:, :valid], dim=-1)
    got = x.clone()
    out = torch.ops.epd.softmax_rows_(got, valid)
    assert out.data_ptr() == got.data_ptr()  # in place
    assert (got[:, valid:] == 0).all()
    # within a few units of float32's last place of the exact value, as ATen's is, plus what e^(x - max)
    # makes of x - max's own rounding (|x - max| units: small probabilities are e^-20 and less here)
    spread = (x[:, :valid] - x[:, :valid].max(dim=-1, keepdim=True).values).abs().double()
    bound = (spread + 8) * torch.finfo(torch.float32).eps * exact + 1e-30
    assert ((got[:, :valid].double() - exact).abs() <= bound).all()
    assert ((aten.double() - exact).abs() <= bound).all()
    torch.testing.assert_close(got[:, :valid].sum(-1), torch.ones(rows), rtol=0, atol=1e-6)


def test_large_and_equal_scores_do_not_overflow_or_lose_the_uniform_row():
    x = torch.tensor([[1e4, 1e4 - 1, -1e4, 0.0] + [0.0] * 20, [3.0] * 24])
    torch.ops.epd.softmax_rows_(x, 24)
    torch.testing.assert_close(x[0, :2].double(), torch.softmax(torch.tensor([0.0, -1.0], dtype=torch.float64), 0),
                               rtol=1e-6, atol=0)
    assert (x[0, 2:] < 1e-30).all()
    torch.testing.assert_close(x[1], torch.full((24,), 1 / 24), rtol=1e-6, atol=0)


@pytest.mark.parametrize("threads", [1, 2])
def test_rows_are_independent_of_how_they_are_split_over_threads(threads):
    x = _scores(300, 100)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = torch.ops.epd.softmax_rows_(x.clone(), 90)
    finally:
        torch.set_num_threads(before)
    for r in (0, 137, 299):
        assert torch.equal(got[r:r + 1], torch.ops.epd.softmax_rows_(x[r:r + 1].clone(), 90))


def test_refuses_what_it_does_not_take():
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.epd.softmax_rows_(torch.zeros(2, 4, dtype=torch.bfloat16), 4)
    with pytest.raises(RuntimeError, match="contiguous"):
        torch.ops.epd.softmax_rows_(torch.zeros(4, 2).t(), 2)
    with pytest.raises(RuntimeError, match="outside 1..4"):
        torch.ops.epd.softmax_rows_(torch.zeros(2, 4), 5)
    with pytest.raises(RuntimeError, match="outside 1..4"):
        torch.ops.epd.softmax_rows_(torch.zeros(2, 4), 0)
