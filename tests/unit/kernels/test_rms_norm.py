"""The native RMSNorm (epd/kernels/rms_norm.cpp) against transformers' own layers, its refusals, and
its installation on a model's norms (epd/engine/fused_norm.py). Model-free."""

from __future__ import annotations

import os
import subprocess
import sys

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


# Widths that take each branch of ATen's summation order: under one vector (scalars), whole groups
# of four vectors, a cascade over 16+ groups with leftover vectors and scalars, and a prompt step's.
WIDTHS = {"narrower than a vector": (40, 5), "per-head q/k": (3, 7, 8, 64), "odd": (5, 24),
          "cascade, leftovers": (17, 16 * 8 * 4 * 3 + 8 * 3 + 5), "decode rows": (16, 512),
          "prompt rows": (1120, 1024)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cls", [Qwen3VLMoeTextRMSNorm, DeepseekV3RMSNorm])
@pytest.mark.parametrize("shape", WIDTHS.values(), ids=WIDTHS.keys())
def test_equals_the_library_layer_bit_for_bit(cls, shape, dtype):
    """The sum of squares adds in ATen's order: a last-bit difference can tip an MoE router."""
    norm = _norm(cls, shape[-1], dtype)
    x = (torch.randn(*shape, generator=torch.Generator().manual_seed(2)) * 3).to(dtype)
    got = torch.ops.epd.rms_norm(x, norm.weight, norm.variance_epsilon)
    want = norm(x)
    assert got.dtype == dtype and got.shape == x.shape
    differ = (got != want).sum().item()
    assert differ == 0, f"{differ} of {x.numel()} differ from the library's layer"


def test_equal_on_one_thread_and_on_two():
    """ATen splits rows among threads, never a row: the order, so the result, is the thread count's."""
    norm = _norm(Qwen3VLMoeTextRMSNorm, 1024, torch.float32)
    x = torch.randn(64, 1024, generator=torch.Generator().manual_seed(4))
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            assert torch.equal(torch.ops.epd.rms_norm(x, norm.weight, norm.variance_epsilon), norm(x)), count
    finally:
        torch.set_num_threads(threads)


_UNDER_A_CAPABILITY = """
import torch
from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextRMSNorm
from epd.kernels.native import load_kernels
assert load_kernels().ok
norm = Qwen3VLMoeTextRMSNorm(1565, eps=1e-6)
x = torch.randn(33, 1565, generator=torch.Generator().manual_seed(5)) * 3
print(torch.backends.cpu.get_cpu_capability(), int((torch.ops.epd.rms_norm(x, norm.weight, 1e-6) != norm(x)).sum()))
"""


@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
def test_equal_whichever_kernels_aten_picks(capability):
    """ATen's sum runs 8-float vectors under every capability (its AVX-512 slot for sum is empty):
    stop 33 took 16 on AVX-512 CPUs and parted from the library there. ATEN_CPU_CAPABILITY caps
    what ATen picks; a CPU without a capability runs the best one it has."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability)
    out = subprocess.run([sys.executable, "-c", _UNDER_A_CAPABILITY], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    picked, differ = out.stdout.split()
    assert differ == "0", f"{differ} values differ from the library's layer under ATen's {picked} kernels"


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
    assert torch.equal(norm(x), want)
    assert torch.equal(norm(x.t().contiguous().t()), want)  # made contiguous
    mixed = x.double()  # another dtype than the weight's: the library's own forward, bit for bit
    assert torch.equal(norm(mixed), type(norm).forward(norm, mixed))
