"""Payloads, clocks and checks shared by the transfer tests."""

from __future__ import annotations

import glob
import os

import torch
from prometheus_client import REGISTRY

from epd.v1 import common_pb2
from epd.wire.tensors import meta_of, tensor_to_bytes

BACKENDS = ["grpc", "shm", "nccl"]
BIG_SHAPE = (1024, 800)  # float32: 3,276,800 bytes > 3 MiB, i.e. 13 chunks of 256 KiB
SMALL_CHUNK = 256 << 10


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def my_segments() -> set[str]:
    return {os.path.basename(p) for p in glob.glob(f"/dev/shm/epd-{os.getpid()}-*")}


def payload() -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    return [
        ("f32", torch.randn(3, 5, generator=gen)),
        ("bf16", torch.randn(4, 7, generator=gen).to(torch.bfloat16)),
        ("i64", torch.arange(-5, 6, dtype=torch.int64) * (1 << 40)),
        ("mask", torch.randn(2, 9, generator=gen) > 0),
        ("scalar", torch.tensor(3.5)),
        ("empty", torch.empty(0, 8, dtype=torch.bfloat16)),
        ("fp8", (torch.randn(6, generator=gen) * 10).to(torch.float8_e4m3fn)),
        ("strided", torch.arange(12, dtype=torch.int32).reshape(3, 4).t()),  # [4, 3], not contiguous
        ("big", torch.randn(*BIG_SHAPE, generator=gen)),
    ]


def metas_of(tensors: list[tuple[str, torch.Tensor]]) -> list[common_pb2.TensorMeta]:
    return [meta_of(name, tensor) for name, tensor in tensors]


def assert_bit_equal(got: list[tuple[str, torch.Tensor]], want: list[tuple[str, torch.Tensor]]) -> None:
    assert [name for name, _ in got] == [name for name, _ in want]
    for (name, a), (_, b) in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert tensor_to_bytes(a) == tensor_to_bytes(b), name


class ReleaseCounter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1
