"""`--dtype`: what each value resolves to, and the warning for half precision on a CPU without the
instructions for it. Model-free."""

from __future__ import annotations

import logging

import pytest
import torch

from epd import dtypes
from epd.dtypes import resolve_dtype, slow_on_cpu

ZEN3 = frozenset("fpu sse sse2 avx avx2 fma".split())  # an AVX2 CPU: no bfloat16 or float16 products
SAPPHIRE_RAPIDS = ZEN3 | {"avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_tile"}
GRAVITON3 = frozenset("fp asimd asimdhp bf16 sve".split())  # ARM: its `Features` line


def test_auto_is_float32_on_the_cpu_and_bfloat16_on_cuda():
    assert resolve_dtype("auto") is torch.float32
    assert resolve_dtype("auto", "cpu") is torch.float32
    assert resolve_dtype("auto", "cuda:0") is torch.bfloat16
    assert resolve_dtype("float16", "cuda") is torch.float16
    with pytest.raises(ValueError, match="--dtype must be one of"):
        resolve_dtype("int8")


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_half_precision_without_its_instructions_is_slow(name):
    warning = slow_on_cpu(name, ZEN3)
    assert warning.startswith(f"--dtype {name} on a CPU without avx512_")
    assert "--dtype float32" in warning


@pytest.mark.parametrize("flags", [SAPPHIRE_RAPIDS, GRAVITON3], ids=["AVX-512 + AMX", "ARM"])
def test_half_precision_with_its_instructions_is_not(flags):
    assert slow_on_cpu("bfloat16", flags) is None
    assert slow_on_cpu("float16", flags) is None


def test_float32_and_unknown_cpus_never_warn():
    assert slow_on_cpu("float32", ZEN3) is None
    assert slow_on_cpu("auto", ZEN3) is None
    assert slow_on_cpu("bfloat16", None) is None  # no /proc/cpuinfo: no warning on a guess


def test_resolving_warns_on_the_cpu_only(monkeypatch, caplog):
    monkeypatch.setattr(dtypes, "cpu_flags", lambda: ZEN3)
    with caplog.at_level(logging.WARNING, logger="epd.dtypes"):
        assert resolve_dtype("bfloat16", "cpu") is torch.bfloat16  # still served: the user asked for it
        assert resolve_dtype("bfloat16", "cuda") is torch.bfloat16  # a GPU: nothing to say
        assert resolve_dtype("float32") is torch.float32
    said = [r.getMessage().split(":")[0] for r in caplog.records]
    assert said == ["--dtype bfloat16 on a CPU without avx512_bf16 / amx_bf16"]
