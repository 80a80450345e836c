"""The native tanh-approximated GELU (epd/kernels/gelu_tanh.cpp) against the float64 function and
ATen's float32 one; its routing in epd.engine.fused_gelu; its refusals. Model-free."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

from epd.engine import fused_gelu
from epd.kernels.native import load_kernels


@pytest.fixture(scope="module", autouse=True)
def kernels():
    built = load_kernels()
    assert built.ok, built.detail


def _exact(x: torch.Tensor) -> torch.Tensor:
    """The function in float64, as x * sigmoid(2u): ATen's 1 + tanh(u) cancels for negative x even
    in float64 (at x = -6.5 a tenth of the value is lost)."""
    x = x.double()
    return x * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))


EPS = torch.finfo(torch.float32).eps


# sizes: shorter than a vector, a vector and a remainder, many parallel tasks and a remainder
@pytest.mark.parametrize("n", [1, 5, 19, 70001])
def test_float32_is_within_the_inputs_rounding_of_the_exact_function_as_aten_is(n):
    x = torch.linspace(-30, 30, n) if n > 1 else torch.tensor([0.3])
    got = torch.ops.epd.gelu_tanh(x)
    assert got.shape == x.shape and got.dtype == torch.float32
    bound = EPS * x.double().abs()  # one unit of float32's last place of x
    assert ((F.gelu(x, approximate="tanh").double() - _exact(x)).abs() <= bound).all()  # the library's too
    assert ((got.double() - _exact(x)).abs() <= bound).all()


def test_float32_keeps_its_relative_precision_where_aten_cancels():
    # ATen's 1 + tanh(u) cancels for negative x (1 + (-1 + tiny)); x / (1 + e^(-2u)) does not: its
    # error is e^z's, about |z| units of the last place for z = -2u (17 at x = -5)
    x = torch.linspace(-5, 5, 20001)
    relative = (torch.ops.epd.gelu_tanh(x).double() - _exact(x)).abs() / _exact(x).abs().clamp_min(1e-300)
    aten = (F.gelu(x, approximate="tanh").double() - _exact(x)).abs() / _exact(x).abs().clamp_min(1e-300)
    assert relative.max() < 32 * EPS < aten.max()


@pytest.mark.parametrize("n", [1, 8])  # the scalar remainder and a whole vector
def test_the_tails_are_the_input_and_zero_as_aten_has_them(n):
    for value in (-1e30, -200.0, -60.0, 20.0, 200.0, 1e30, 0.0, float("inf"), float("-inf")):
        x = torch.full((n,), value)
        want = F.gelu(x, approximate="tanh")  # -inf gives NaN there too (-inf * 0)
        torch.testing.assert_close(torch.ops.epd.gelu_tanh(x), want, rtol=0, atol=0, equal_nan=True)
    assert torch.ops.epd.gelu_tanh(torch.full((n,), float("nan"))).isnan().all()


def test_bfloat16_is_the_float32_value_rounded():
    x = torch.randn(4099, generator=torch.Generator().manual_seed(0)).mul(4).bfloat16()
    got = torch.ops.epd.gelu_tanh(x)
    assert got.dtype == torch.bfloat16
    # the exact value rounded, but where it lies within float32's error of a rounding boundary
    want = _exact(x).float().bfloat16()
    assert (got != want).float().mean() < 0.01
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -8, atol=2 ** -120)  # 0 past z = 87


def test_a_shaped_input_keeps_its_shape_and_each_element_its_own_value():
    x = torch.randn(3, 17, 40, generator=torch.Generator().manual_seed(1))
    got = torch.ops.epd.gelu_tanh(x)
    assert got.shape == x.shape
    torch.testing.assert_close(got, torch.ops.epd.gelu_tanh(x.flatten()).view(3, 17, 40), rtol=0, atol=0)


def test_refuses_other_dtypes_and_strided_inputs():
    with pytest.raises(RuntimeError, match="float32 and bfloat16"):
        torch.ops.epd.gelu_tanh(torch.zeros(8, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="contiguous"):
        torch.ops.epd.gelu_tanh(torch.zeros(8, 8).t())


def test_install_reroutes_the_library_gelu_tanh_only():
    model = torch.nn.Sequential(ACT2FN["gelu_pytorch_tanh"], ACT2FN["gelu"], torch.nn.Linear(16, 16))
    assert fused_gelu.install(model) == 1
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(model[0](x), F.gelu(x, approximate="tanh"), rtol=0, atol=1e-6)
    assert model[0].forward.__func__ is fused_gelu.fused_gelu_tanh_forward
    half = x.half()  # a dtype the kernel does not take: the library's forward
    torch.testing.assert_close(model[0](half), F.gelu(half, approximate="tanh"), rtol=0, atol=0)
    strided = x.t()  # made contiguous for the kernel
    torch.testing.assert_close(model[0](strided), F.gelu(strided, approximate="tanh"), rtol=0, atol=1e-6)
