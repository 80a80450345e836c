"""`--dtype` for every worker: the element type of weights, activations and the KV pool."""

from __future__ import annotations

import logging

from epd.cpuinfo import cpu_flags

log = logging.getLogger(__name__)

DTYPES = ("auto", "float32", "bfloat16", "float16")

# CPU feature flags (/proc/cpuinfo) under which torch's half-precision products run in hardware. Without
# them oneDNN widens every element in software: on an AVX2 Zen 3, a [1024, 384] x [384, 1152] linear took
# 109 ms in bfloat16 against 12.8 in float32, and an image request's vision tower + prompt 4.7 CPU-s
# against 0.67.
_FAST_ON_CPU = {"bfloat16": ("avx512_bf16", "amx_bf16", "bf16"), "float16": ("avx512_fp16", "amx_fp16", "asimdhp")}


def resolve_dtype(name: str, device=None):
    """The torch dtype for a `--dtype` value; `auto` is bfloat16 on a CUDA `device`, float32 on the CPU.

    A half-precision dtype asked for on a CPU without the instructions for it is served, with a
    warning that says so (see `slow_on_cpu`)."""
    import torch

    if name not in DTYPES:
        raise ValueError(f"--dtype must be one of {DTYPES}, got {name!r}")
    if name == "auto":
        return torch.bfloat16 if device is not None and torch.device(device).type == "cuda" else torch.float32
    on_cpu = device is None or torch.device(device).type == "cpu"
    if on_cpu and (warning := slow_on_cpu(name, cpu_flags())):
        log.warning(warning)
    return getattr(torch, name)


def slow_on_cpu(name: str, cpu_flags: frozenset[str] | None) -> str | None:
    """Why `--dtype name` will be slow on a CPU with these feature flags, or None; pure.

    None also when the flags are unknown (no /proc/cpuinfo): no warning on a guess."""
    wanted = _FAST_ON_CPU.get(name)
    if wanted is None or cpu_flags is None or cpu_flags & set(wanted):
        return None
    return (f"--dtype {name} on a CPU without {' / '.join(wanted[:2])}: torch converts every element in "
            f"software, so matrix products run several times slower than in float32 (7-8x on an AVX2 "
            f"Zen 3); --dtype float32 (the CPU default) is faster here")
