"""`--dtype` for every worker: the element type of weights, activations and the KV pool."""

from __future__ import annotations

DTYPES = ("auto", "float32", "bfloat16", "float16")


def resolve_dtype(name: str, device=None):
    """The torch dtype for a `--dtype` value; `auto` is bfloat16 on a CUDA `device`, float32 on the CPU."""
    import torch

    if name not in DTYPES:
        raise ValueError(f"--dtype must be one of {DTYPES}, got {name!r}")
    if name == "auto":
        return torch.bfloat16 if device is not None and torch.device(device).type == "cuda" else torch.float32
    return getattr(torch, name)
