"""`--dtype` for every worker: the element type of weights, activations and the KV pool."""

from __future__ import annotations

DTYPES = ("auto", "float32", "bfloat16", "float16")


def resolve_dtype(name: str):
    """The torch dtype for a `--dtype` value; `auto` is float32 on CPU (bfloat16 once a GPU is used)."""
    import torch

    if name not in DTYPES:
        raise ValueError(f"--dtype must be one of {DTYPES}, got {name!r}")
    return torch.float32 if name == "auto" else getattr(torch, name)
