"""Checks a Pull stream chunk by chunk against the expected metadata and fills preallocated tensors.

The stream is untrusted input: every chunk must continue exactly where the previous one ended, a
tensor's first chunk must carry the expected meta, nothing may overflow, and the stream must end
with every byte delivered. Any breach is a TransferError(DATA_LOSS), never a wrong tensor.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence

import grpc
import numpy as np
import torch

from epd.transfer.errors import TransferError
from epd.v1 import common_pb2, transfer_pb2
from epd.wire.tensors import dtype_from_proto


def _empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype)


def allocate(meta: common_pb2.TensorMeta, empty=_empty) -> tuple[torch.Tensor, np.ndarray]:
    """A tensor for `meta` from `empty(shape, dtype)` and a [nbytes] uint8 numpy view of it to write into."""
    tensor = empty(tuple(meta.shape), dtype_from_proto(meta.dtype))
    return tensor, tensor.reshape(-1).view(torch.uint8).numpy()  # view: [numel * itemsize]


def check_bool(tensor: torch.Tensor) -> bool:
    """False when a bool tensor holds bytes other than 0 and 1 (torch would misbehave on them)."""
    return tensor.dtype != torch.bool or not bool((tensor.reshape(-1).view(torch.uint8) > 1).any())


def _describe(meta: common_pb2.TensorMeta) -> str:
    # The meta came off the wire: its dtype may be a value this build has no name for.
    dtype = common_pb2.DType.Name(meta.dtype) if meta.dtype in common_pb2.DType.values() else str(meta.dtype)
    return f"{meta.name!r} {dtype} {list(meta.shape)}"


class Copier:
    """Copies chunks into place on a thread of its own, so the next chunk is received while this one lands.

    Copying into a fresh tensor (page faults included) takes about as long as receiving the bytes, and
    gRPC asks the peer for the next message only once the previous one was taken: done inline, the two
    add up. numpy releases the GIL while it copies. The queue is bounded (`depth` chunks in flight),
    so a slow copy slows the stream instead of buffering it. `close()` waits for every copy queued.
    """

    def __init__(self, depth: int = 8) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._run, name="epd-pull-copier", daemon=True)
        self._thread.start()

    def copy(self, target: np.ndarray, data) -> None:
        self._queue.put((target, data))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            target, data = item
            target[:] = np.frombuffer(data, dtype=np.uint8)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


def _copy_inline(target: np.ndarray, data) -> None:
    target[:] = np.frombuffer(data, dtype=np.uint8)


class PullAssembler:
    """Feed `add` every chunk in order, then `finish` for the tensors (in meta order).

    `copy(target, data)` moves a chunk's bytes into place (a Copier's, to overlap copying with receiving;
    inline by default); `finish` may be called only once every copy handed to it is done. `empty(shape,
    dtype)` makes each tensor (torch.empty by default; a receiver's warm ReceiveBuffers).
    """

    def __init__(self, metas: Sequence[common_pb2.TensorMeta], nbytes: Sequence[int], handle_id: str, owner: str,
                 copy=_copy_inline, empty=_empty):
        self._metas = list(metas)
        self._nbytes = list(nbytes)
        self._where = {"handle_id": handle_id, "owner_address": owner}
        self._tensors: list[torch.Tensor] = []
        self._buffer: np.ndarray | None = None  # byte view of the tensor being filled
        self._filled = 0  # bytes of the current tensor received so far
        self._copy = copy
        self._empty = empty

    def add(self, chunk: transfer_pb2.PullChunk) -> None:
        """Copy one chunk into place; TransferError(DATA_LOSS) if it does not fit the metadata."""
        if chunk.HasField("meta"):
            self._start_tensor(chunk.meta)
        elif self._buffer is None:
            self._fail("first chunk of the stream carries no tensor meta")
        index = len(self._tensors) - 1
        name = self._metas[index].name
        if chunk.offset_bytes != self._filled:
            self._fail(f"tensor {name!r}: chunk at byte {chunk.offset_bytes}, expected {self._filled}")
        end = self._filled + len(chunk.data)
        if end > self._nbytes[index]:
            self._fail(f"tensor {name!r}: chunk ends at byte {end}, past its {self._nbytes[index]} bytes")
        if len(chunk.data):
            self._copy(self._buffer[self._filled:end], chunk.data)
        self._filled = end

    def finish(self) -> list[torch.Tensor]:
        """The completed tensors; TransferError(DATA_LOSS) if the stream stopped short."""
        self._check_current_complete()
        if len(self._tensors) != len(self._metas):
            self._fail(f"stream ended after {len(self._tensors)} of {len(self._metas)} tensors")
        for meta, tensor in zip(self._metas, self._tensors, strict=True):
            if not check_bool(tensor):
                self._fail(f"tensor {meta.name!r}: bool data holds bytes other than 0 and 1")
        return self._tensors

    def _start_tensor(self, meta: common_pb2.TensorMeta) -> None:
        self._check_current_complete()
        index = len(self._tensors)
        if index >= len(self._metas):
            self._fail(f"stream sent a tensor {meta.name!r} beyond the {len(self._metas)} expected")
        expected = self._metas[index]
        if meta != expected:
            self._fail(f"tensor {index} is {_describe(meta)}, expected {_describe(expected)}")
        tensor, self._buffer = allocate(expected, self._empty)
        self._tensors.append(tensor)
        self._filled = 0

    def _check_current_complete(self) -> None:
        if self._tensors and self._filled != self._nbytes[len(self._tensors) - 1]:
            name = self._metas[len(self._tensors) - 1].name
            self._fail(f"tensor {name!r} got {self._filled} of {self._nbytes[len(self._tensors) - 1]} bytes")

    def _fail(self, message: str) -> None:
        raise TransferError(grpc.StatusCode.DATA_LOSS, message, **self._where)
