"""Choosing the decode attention at engine start: native where it runs, torch otherwise, and a
worker asked for `native` that cannot have it refuses to start."""

from __future__ import annotations

import pytest
import torch

from epd.engine import decode_backend
from epd.kernels import native

CPU = torch.device("cpu")


def test_native_runs_on_cpu_pools_of_float32_and_bfloat16():
    assert decode_backend.native_unsupported(CPU, torch.float32) is None
    assert decode_backend.native_unsupported(CPU, torch.bfloat16) is None
    assert "float16" in decode_backend.native_unsupported(CPU, torch.float16)
    assert "on cuda" in decode_backend.native_unsupported(torch.device("cuda", 0), torch.float32)


def test_torch_is_chosen_without_building(monkeypatch):
    monkeypatch.setattr(native, "load_paged_decode", lambda: pytest.fail("built for the torch mode"))
    assert decode_backend.reads_pool_in_place("torch", CPU, torch.float32) is False


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="auto, native, torch"):
        decode_backend.reads_pool_in_place("fast", CPU, torch.float32)


def test_auto_falls_back_and_native_refuses_when_the_build_fails(monkeypatch, caplog):
    monkeypatch.setattr(native, "load_paged_decode", lambda: native.BuildResult(False, "no C++ compiler"))
    assert decode_backend.reads_pool_in_place("auto", CPU, torch.float32) is False
    assert "decode attention: torch (gather + matmuls): no C++ compiler" in caplog.text
    with pytest.raises(RuntimeError, match=r"--decode-attention native: no C\+\+ compiler"):
        decode_backend.reads_pool_in_place("native", CPU, torch.float32)


def test_auto_falls_back_and_native_refuses_on_an_unsupported_pool():
    assert decode_backend.reads_pool_in_place("auto", CPU, torch.float16) is False
    with pytest.raises(RuntimeError, match="float16"):
        decode_backend.reads_pool_in_place("native", CPU, torch.float16)


def test_a_kernel_that_fails_its_self_check_is_not_used(monkeypatch):
    monkeypatch.setattr(native, "load_paged_decode", lambda: native.BuildResult(True, "stand-in"))
    monkeypatch.setattr(decode_backend, "self_check", lambda dtype: "the built kernel is off by 1 (> 0.0001)")
    assert decode_backend.reads_pool_in_place("auto", CPU, torch.float32) is False
    with pytest.raises(RuntimeError, match="off by 1"):
        decode_backend.reads_pool_in_place("native", CPU, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_built_kernel_passes_its_self_check(dtype):
    assert native.load_paged_decode().ok
    assert decode_backend.self_check(dtype) is None
    assert decode_backend.reads_pool_in_place("native", CPU, dtype) is True
