"""The native RMSNorm (epd/kernels/rms_norm.cpp) against transformers' own layers, its refusals, and
its installation on a model's norms (epd/engine/fused_norm.py). Model-free."""

from __future__ import annotations

import pytest
import torch
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm
from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextRMSNorm

from epd.engine import fused_norm
from epd.kernels.native import load_kernels


@pytest.fixture(scope="module", autouse=True)
def kernels():
    built = load_kernels()
    assert built.ok, built.detail


def _norm(cls, width: int, dtype: torch.dtype) -> torch.nn.Module:
    norm = cls(width, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(width, generator=torch.Generator().manual_seed(1)) + 0.5)
    return norm.to(dtype)


@pytest.mark.parametrize("cls", [Qwen3VLMoeTextRMSNorm, DeepseekV3RMSNorm])
@pytest.mark.parametrize("shape", [(16, 512), (3, 7, 8, 64), (5, 24)], ids=["decode rows", "per-head q/k", "odd"])
def test_float32_equals_the_library_layer_to_the_last_bit_or_so(cls, shape):
    norm = _norm(cls, shape[-1], torch.float32)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2)) * 3
    got = torch.ops.epd.rms_norm(x, norm.weight, norm.variance_epsilon)
    want = norm(x)
    # Only the sum of squares' order differs: a few float32 ulps (relative 5e-7) at most.
    torch.testing.assert_close(got, want, atol=0, rtol=5e-7)


def test_bfloat16_is_rounded_twice_as_the_library_rounds_it():
    """x * rsqrt(...) is rounded to bfloat16 before the weight multiplies it, as `.to(input_dtype)` does."""
    norm = _norm(Qwen3VLMoeTextRMSNorm, 512, torch.bfloat16)
    x = torch.randn(1120, 512, generator=torch.Generator().manual_seed(3)).bfloat16()
    got = torch.ops.epd.rms_norm(x, norm.weight, norm.variance_epsilon)
    want = norm(x)
    differ = (got != want).sum().item()
    assert got.dtype == torch.bfloat16 and differ <= x.numel() // 10_000, f"{differ} of {x.numel()} differ"
    torch.testing.assert_close(got, want, atol=0, rtol=2 ** -6)  # one bfloat16 step where they differ


def test_refuses_mismatched_or_unsupported_inputs():
    x, weight = torch.randn(4, 8), torch.ones(8)
    with pytest.raises(RuntimeError, match=r"weight has shape \[6\]; expected \[8\]"):
        torch.ops.epd.rms_norm(x, torch.ones(6), 1e-6)
    with pytest.raises(RuntimeError, match="weight is BFloat16, x Float"):
        torch.ops.epd.rms_norm(x, weight.bfloat16(), 1e-6)
    with pytest.raises(RuntimeError, match="not Half"):
        torch.ops.epd.rms_norm(x.half(), weight.half(), 1e-6)
    with pytest.raises(RuntimeError, match="contiguous"):
        torch.ops.epd.rms_norm(torch.randn(8, 4).t(), weight[:4], 1e-6)


def test_installed_on_the_known_classes_only():
    model = torch.nn.Sequential(_norm(Qwen3VLMoeTextRMSNorm, 8, torch.float32), torch.nn.LayerNorm(8),
                                _norm(DeepseekV3RMSNorm, 8, torch.float32))
    assert fused_norm.install(model) == 2
    assert "forward" in model[0].__dict__ and "forward" in model[2].__dict__
    assert "forward" not in model[1].__dict__  # not an RMSNorm of the known formula: its own forward


def test_an_installed_norm_equals_its_class_and_falls_back_where_the_kernel_does_not_apply():
    norm = _norm(Qwen3VLMoeTextRMSNorm, 64, torch.float32)
    x = torch.randn(6, 64)
    want = norm(x)
    fused_norm.install(norm)
    torch.testing.assert_close(norm(x), want, atol=0, rtol=5e-7)
    torch.testing.assert_close(norm(x.t().contiguous().t()), want, atol=0, rtol=5e-7)  # made contiguous
    mixed = x.double()  # another dtype than the weight's: the library's own forward, bit for bit
    assert torch.equal(norm(mixed), type(norm).forward(norm, mixed))
