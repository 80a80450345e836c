"""The closed sets of transfer kinds and backends, shared by sender, receiver and metric labels.

Closed on purpose: they become Prometheus label values, and an open set would let a typo (or a
peer) create unbounded series.
"""

from __future__ import annotations

from epd.v1 import common_pb2

KINDS: tuple[str, ...] = ("embedding", "kv")
BACKENDS: dict[str, int] = {"grpc": common_pb2.TRANSFER_BACKEND_GRPC, "shm": common_pb2.TRANSFER_BACKEND_SHM,
                            "nccl": common_pb2.TRANSFER_BACKEND_NCCL, "cuda_ipc": common_pb2.TRANSFER_BACKEND_CUDA_IPC}


def check_kind(kind: str) -> str:
    """`kind` itself if it is a known transfer kind; ValueError naming the choices otherwise."""
    if kind not in KINDS:
        raise ValueError(f"transfer kind {kind!r} is not one of {KINDS}")
    return kind


def check_backend(backend: str) -> str:
    """`backend` itself if this package implements it; ValueError naming the choices otherwise."""
    if backend not in BACKENDS:
        raise ValueError(f"transfer backend {backend!r} is not one of {tuple(BACKENDS)}")
    return backend
