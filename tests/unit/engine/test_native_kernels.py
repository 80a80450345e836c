"""Choosing the kernels at engine start: native where they run, torch's otherwise, and a worker
asked for `native` that cannot have them refuses to start."""

from __future__ import annotations

import pytest
import torch

from epd.engine import native_kernels
from epd.kernels import native

CPU = torch.device("cpu")


def test_native_runs_on_cpu_pools_of_float32_and_bfloat16():
    assert native_kernels.native_unsupported(CPU, torch.float32) is None
    assert native_kernels.native_unsupported(CPU, torch.bfloat16) is None
    assert "float16" in native_kernels.native_unsupported(CPU, torch.float16)
    assert "on cuda" in native_kernels.native_unsupported(torch.device("cuda", 0), torch.float32)


def test_torch_is_chosen_without_building(monkeypatch):
    monkeypatch.setattr(native, "load_kernels", lambda: pytest.fail("built for the torch mode"))
    assert native_kernels.use_native_kernels("torch", CPU, torch.float32) is False


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="auto, native, torch"):
        native_kernels.use_native_kernels("fast", CPU, torch.float32)


def test_auto_falls_back_and_native_refuses_when_the_build_fails(monkeypatch, caplog):
    monkeypatch.setattr(native, "load_kernels", lambda: native.BuildResult(False, "no C++ compiler"))
    assert native_kernels.use_native_kernels("auto", CPU, torch.float32) is False
    assert "kernels: torch's (no native decode attention, RMSNorm, MoE combine and decode experts): no C++ compiler" \
        in caplog.text
    with pytest.raises(RuntimeError, match=r"--kernels native: no C\+\+ compiler"):
        native_kernels.use_native_kernels("native", CPU, torch.float32)


def test_auto_falls_back_and_native_refuses_on_an_unsupported_pool():
    assert native_kernels.use_native_kernels("auto", CPU, torch.float16) is False
    with pytest.raises(RuntimeError, match="float16"):
        native_kernels.use_native_kernels("native", CPU, torch.float16)


def test_a_kernel_that_fails_its_self_check_is_not_used(monkeypatch):
    monkeypatch.setattr(native, "load_kernels", lambda: native.BuildResult(True, "stand-in"))
    monkeypatch.setattr(native_kernels, "self_check", lambda dtype: "the built rms_norm is off by 1 (> 0.0001)")
    assert native_kernels.use_native_kernels("auto", CPU, torch.float32) is False
    with pytest.raises(RuntimeError, match="off by 1"):
        native_kernels.use_native_kernels("native", CPU, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_built_kernel_passes_its_self_check(dtype):
    assert native.load_kernels().ok
    assert native_kernels.self_check(dtype) is None
    assert native_kernels.use_native_kernels("native", CPU, dtype) is True


def test_a_kernel_that_raises_in_the_self_check_is_not_used(monkeypatch):
    def broken(*args):
        raise RuntimeError("no such op\nmore detail")

    monkeypatch.setattr(native_kernels, "reference_rms_norm", broken)
    assert native_kernels.self_check(torch.float32) == (
        "the built kernels raised in their self-check: RuntimeError: no such op")


@pytest.mark.parametrize(("dtype", "float32_only"),
                         [(torch.float32, {"linear_decode", "softmax_rows_"}), (torch.bfloat16, set())])
def test_the_self_check_covers_every_kernel_the_dtype_runs(dtype, float32_only):
    assert native.load_kernels().ok
    assert set(native_kernels._self_check_results(dtype)) == {
        "paged_decode", "rms_norm", "moe_combine", "moe_decode", "gelu_tanh"} | float32_only
