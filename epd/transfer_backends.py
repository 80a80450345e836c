"""`--transfer` for workers and `epd serve`: how a worker's outputs are fetched (DESIGN.md "Transfer layer").

A module of its own with no imports, so every CLI parser can name the choices without loading torch
or protobuf.
"""

from __future__ import annotations

TRANSFER_BACKENDS = ("grpc", "shm", "nccl", "cuda_ipc")
TRANSFER_HELP = ("how this worker's outputs are pulled: grpc (anywhere), shm (same host), nccl "
                 "(torch.distributed send/recv: NCCL between GPUs, gloo on CPU machines) or cuda_ipc "
                 "(GPU memory mapped by workers on the same node; needs CUDA)")


def check_transfer(name: str) -> str:
    """`name` itself if it is a transfer backend; ValueError naming the flag and the choices otherwise."""
    if name not in TRANSFER_BACKENDS:
        raise ValueError(f"--transfer must be one of {', '.join(TRANSFER_BACKENDS)}, got {name!r}")
    return name
