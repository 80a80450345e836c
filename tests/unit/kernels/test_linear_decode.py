"""The native decode-sized dense product (epd/kernels/linear_decode.cpp) against F.linear on random
weights, within float32 rounding; its routing in epd.engine.decode_linear; its refusals. Model-free."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from epd.engine import decode_linear
from epd.kernels.native import load_kernels


@pytest.fixture(scope="module", autouse=True)
def kernels():
    built = load_kernels()
    assert built.ok, built.detail


def _random(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# rows: one pass (1-4), a pass and a remainder (5, 7), two passes (8); outputs: a remainder of the 4
# computed together (7, 130) and of the 64 per parallel job (130, 200)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8])
@pytest.mark.parametrize(("outputs", "width"), [(7, 16), (130, 64), (200, 512)])
def test_equals_f_linear_within_float32_rounding(rows, outputs, width):
    x, w = _random(rows, width, seed=rows), _random(outputs, width, seed=outputs)
    got = torch.ops.epd.linear_decode(x, w)
    assert got.shape == (rows, outputs) and got.dtype == torch.float32
    # Each output sums `width` products of about 1 in float32 in another order than MKL's: both are
    # within a few units of float32's last place (1.2e-7) per term of the exact sum (3e-7 here).
    exact = F.linear(x.double(), w.double())
    bound = 3e-7 * width
    assert (F.linear(x, w).double() - exact).abs().max() < bound  # the bound holds for the library too
    torch.testing.assert_close(got.double(), exact, atol=bound, rtol=0)


def test_each_output_is_its_own_rows_product():
    """A permutation of w's rows permutes the outputs the same way: no output reads another's row."""
    x, w = _random(3, 32, seed=1), _random(12, 32, seed=2)
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(3))
    assert torch.equal(torch.ops.epd.linear_decode(x, w[perm]), torch.ops.epd.linear_decode(x, w)[:, perm])


@pytest.mark.parametrize(("x", "w", "message"), [
    (torch.zeros(2, 12), torch.zeros(4, 12), "multiple of"),  # lanes are 8 or 16 floats
    (torch.zeros(2, 32), torch.zeros(4, 16), "are not \\[T, K\\] and \\[N, K\\]"),
    (torch.zeros(2, 32, dtype=torch.bfloat16), torch.zeros(4, 32, dtype=torch.bfloat16), "takes float32"),
    (torch.zeros(32, 2).t(), torch.zeros(4, 32), "contiguous"),
])
def test_refuses_what_it_cannot_compute(x, w, message):
    with pytest.raises(RuntimeError, match=message):
        torch.ops.epd.linear_decode(x, w)


def _linear(in_features: int = 64, out_features: int = 48, bias: bool = False,
            dtype: torch.dtype = torch.float32) -> torch.nn.Linear:
    layer = torch.nn.Linear(in_features, out_features, bias=bias).to(dtype)
    with torch.no_grad():
        layer.weight.copy_(_random(out_features, in_features, seed=5))
    return layer


@pytest.mark.parametrize(("layer", "taken"), [
    (_linear(), True),
    (_linear(bias=True), False),  # the kernel adds no bias
    (_linear(dtype=torch.bfloat16), False),  # oneDNN's bfloat16 products read a few rows' weights well
    (_linear(in_features=40), False),  # not a whole number of 16-float vectors
    (torch.nn.Identity(), False),
])
def test_takes_bias_free_float32_linears_only(layer, taken):
    assert decode_linear.takes(layer) is taken


def test_decode_rows_go_through_the_kernel_and_prompt_rows_through_the_library():
    model = torch.nn.Sequential(_linear(), _linear(in_features=48, out_features=64, bias=True))
    assert decode_linear.install(model) == 1  # the second one has a bias
    layer = model[0]
    decode = _random(2, 3, 64, seed=6)  # [B, T, in]: 6 rows
    prompt = _random(1, decode_linear.MAX_ROWS + 1, 64, seed=7)
    with torch.inference_mode():
        got_decode, got_prompt = layer(decode), layer(prompt)
    want_decode = F.linear(decode, layer.weight)
    assert got_decode.shape == (2, 3, 48)
    torch.testing.assert_close(got_decode, want_decode, atol=1e-5, rtol=1e-5)
    assert torch.equal(got_decode, torch.ops.epd.linear_decode(decode.reshape(6, 64), layer.weight).view(2, 3, 48))
    assert torch.equal(got_prompt, F.linear(prompt, layer.weight))  # the library's own bits


@pytest.mark.parametrize(("x", "w", "kernel"), [
    (_random(2, 3, 64, seed=8), _random(48, 64, seed=9), True),  # [B, T, K], 6 rows
    (_random(64, 5, seed=10).t(), _random(48, 64, seed=9), True),  # not contiguous: made so
    (_random(9, 64, seed=11), _random(48, 64, seed=9), False),  # more rows than max_rows
    (_random(0, 64, seed=12), _random(48, 64, seed=9), False),  # none
    (_random(2, 36, seed=13), _random(48, 36, seed=9), False),  # K not whole vectors (of 8 or 16)
    (_random(2, 64, seed=14).bfloat16(), _random(48, 64, seed=9).bfloat16(), False),
])
def test_linear_rows_takes_what_the_kernel_can_and_gives_the_rest_to_the_library(x, w, kernel):
    got = torch.ops.epd.linear_rows(x, w, 8)
    assert got.shape == (*x.shape[:-1], w.shape[0]) and got.dtype == x.dtype
    k = x.shape[-1]
    want = (torch.ops.epd.linear_decode(x.reshape(-1, k).contiguous(), w).view(got.shape) if kernel
            else F.linear(x, w))
    assert torch.equal(got, want)
