"""What a lease holds: the tensors' metadata plus a source of their bytes (memory or a shm segment).

The servicer streams any lease through `open_reader()`, whatever its backend, so a receiver on
another host can still Pull an shm-backed handle (the fallback when the segment is not visible).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import torch

from epd.transfer.shm import open_segment, pread_bytes, unlink_segment
from epd.v1 import common_pb2


class SourceGone(LookupError):
    """The lease's bytes were freed before a reader could be opened on them."""


class ByteReader(Protocol):
    """Random access to the bytes of the tensors behind one lease."""

    def read(self, index: int, start: int, stop: int) -> bytes | memoryview:
        """Bytes [start, stop) of tensor `index`: a view when they are in this process's memory (valid
        while the reader is open), else a copy."""
        ...


class _MemoryReader:
    def __init__(self, views: list[torch.Tensor]) -> None:
        self._views = views

    def read(self, index: int, start: int, stop: int) -> bytes:
        return memoryview(self._views[index][start:stop].cpu().numpy())  # cpu(): a copy only off a device


class MemorySource:
    """Bytes held as tensors (grpc: CPU, nccl: where they were made): the lease keeps them alive until freed."""

    def __init__(self, views: list[torch.Tensor]) -> None:
        self._views: list[torch.Tensor] | None = views  # each [nbytes] uint8; may share the publisher's storage

    def views(self) -> list[torch.Tensor]:
        """The [nbytes] uint8 views, for a send over a group; SourceGone once freed."""
        views = self._views
        if views is None:
            raise SourceGone("tensors were released")
        return views

    @contextmanager
    def open_reader(self) -> Iterator[ByteReader]:
        """SourceGone once freed; an open reader holds its own reference, so a release cannot cut it short."""
        views = self._views
        if views is None:
            raise SourceGone("tensors were released")
        yield _MemoryReader(views)

    def free(self) -> bool:
        """Drop the lease's references; returns False (there is no segment to unlink)."""
        self._views = None
        return False


class _ShmReader:
    def __init__(self, fd: int, offsets: list[int]) -> None:
        self._fd = fd
        self._offsets = offsets

    def read(self, index: int, start: int, stop: int) -> bytes:
        return pread_bytes(self._fd, stop - start, self._offsets[index] + start)


class ShmSource:
    """Bytes in a shared-memory segment file (shm backend); freeing unlinks it."""

    def __init__(self, path: str, offsets: list[int]) -> None:
        self.path = path
        self._offsets = offsets

    @contextmanager
    def open_reader(self) -> Iterator[ByteReader]:
        """SourceGone if the segment is already unlinked; once open, an unlink does not cut it short."""
        try:
            fd = open_segment(self.path)
        except FileNotFoundError:
            raise SourceGone(f"segment {self.path} was unlinked") from None
        try:
            yield _ShmReader(fd, self._offsets)
        finally:
            os.close(fd)

    def free(self) -> bool:
        """Unlink the segment; True if this call removed it."""
        return unlink_segment(self.path)


@dataclass(slots=True)
class Lease:
    """One published handle's contents; `on_release` runs once when the lease ends."""

    kind: str
    metas: list[common_pb2.TensorMeta]
    nbytes: list[int]
    source: MemorySource | ShmSource
    on_release: Callable[[], None] | None
