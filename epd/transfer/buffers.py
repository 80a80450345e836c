"""Warm memory for large pulls: a bounded pool of byte buffers, each reused once no tensor views it.

A pull fills a fresh tensor, and a fresh large tensor is fresh pages: glibc maps every allocation
over its mmap threshold (32 MiB at most) anew and unmaps it on free, so each 64 MB pull faulted in
16k zeroed pages while receiving. Measured here that is a fifth of a pull's time, and on this VM,
whose page faults are uneven, a pull now and then ran at a third of its usual speed. The raw
socket it is measured against receives into one warm buffer; so do serving systems that receive into
registered buffers.

A buffer is a `bytearray` that the handed-out tensor wraps with `torch.frombuffer`: the tensor's
storage holds a reference to it until the last tensor, view or numpy array on that storage is
gone, so the buffer's reference count says whether anything still uses it. No callback is needed
and a caller that keeps a tensor for as long as it likes only keeps that buffer out of reuse.
Bounded: when every buffer is in use and the budget is spent, a pull gets a plain tensor.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence

import torch

DEFAULT_MAX_BYTES = 256 << 20
DEFAULT_MIN_BYTES = 4 << 20  # smaller tensors come from malloc's heap, whose pages stay warm anyway


def _references(buffers: list[bytearray], index: int) -> int:
    """The reference count of buffers[index] as seen from here (the pool's list entry + call overhead)."""
    return sys.getrefcount(buffers[index])


def _idle_references() -> int:
    """What `_references` reads for a buffer nothing but the pool holds: measured, not assumed, so a
    different interpreter's counting cannot make a buffer in use look free."""
    probe = [bytearray(1)]
    return _references(probe, 0)


class ReceiveBuffers:
    """Thread-safe. `tensor(shape, dtype)` is a writable CPU tensor, from a warm buffer when one fits."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, min_bytes: int = DEFAULT_MIN_BYTES) -> None:
        if max_bytes < 0 or min_bytes < 1:
            raise ValueError(f"receive buffers need max_bytes >= 0 and min_bytes >= 1, got {max_bytes}, {min_bytes}")
        self._max_bytes = max_bytes
        self._min_bytes = min_bytes
        self._buffers: list[bytearray] = []  # least recently handed out first
        self._idle = _idle_references()
        self._lock = threading.Lock()

    def tensor(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """Uninitialized contents, like torch.empty (a reused buffer holds its last pull's bytes)."""
        nbytes = torch.Size(shape).numel() * dtype.itemsize
        buffer = self._take(nbytes) if self._min_bytes <= nbytes <= self._max_bytes else None
        if buffer is None:
            return torch.empty(tuple(shape), dtype=dtype)
        return torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes).view(dtype).reshape(tuple(shape))

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return sum(len(buffer) for buffer in self._buffers)

    def in_use(self) -> int:
        """How many buffers some tensor still views."""
        with self._lock:
            return sum(not self._is_free(index) for index in range(len(self._buffers)))

    def clear(self) -> None:
        """Forget every buffer (one in use lives on with its tensors); the pool stays usable."""
        with self._lock:
            self._buffers.clear()

    def _take(self, nbytes: int) -> bytearray | None:
        """The smallest free buffer of nbytes..2*nbytes, else a new one within the budget (free buffers
        dropped, least recently used first, to make room), else None."""
        with self._lock:
            fits = [index for index in range(len(self._buffers))
                    if nbytes <= len(self._buffers[index]) <= 2 * nbytes and self._is_free(index)]
            if fits:
                index = min(fits, key=lambda i: len(self._buffers[i]))
                buffer = self._buffers.pop(index)
            else:
                if not self._make_room(nbytes):
                    return None
                buffer = bytearray(nbytes)
            self._buffers.append(buffer)  # most recently used last
            return buffer

    def _make_room(self, nbytes: int) -> bool:
        held = sum(len(buffer) for buffer in self._buffers)
        index = 0
        while held + nbytes > self._max_bytes and index < len(self._buffers):
            if self._is_free(index):
                held -= len(self._buffers.pop(index))
            else:
                index += 1
        return held + nbytes <= self._max_bytes

    def _is_free(self, index: int) -> bool:
        return _references(self._buffers, index) == self._idle
