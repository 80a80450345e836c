"""The consumer side: fetch the tensors behind a handle, then ack so the owner frees them at once.

Every wait is bounded by `timeout_s` (a gRPC deadline on Pull, a short one on the ack). Success
acks; so does a fetch whose bytes disagreed with the metadata (retrying cannot help, so the owner
should not hold them until the TTL). A fetch that failed because the owner was unreachable, slow or
had no such handle does not ack: the owner's TTL frees what it still holds.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence

import grpc
import torch

from epd import tracing
from epd.metrics import TRANSFER_BYTES, TRANSFER_SECONDS
from epd.transfer.acks import AckQueue
from epd.transfer.assembly import Copier, PullAssembler, check_bool
from epd.transfer.buffers import DEFAULT_MAX_BYTES, ReceiveBuffers
from epd.transfer.channels import ChannelPool
from epd.transfer.chunks import decode_chunk
from epd.transfer.errors import TransferError
from epd.transfer.groups import OWNER_RANK
from epd.transfer.labels import check_kind
from epd.transfer.layout import CHUNK_HEADROOM_BYTES, MAX_CHUNK_BYTES, MIN_CHUNK_BYTES, shm_layout, shm_segment_bytes
from epd.transfer.pairs import PullerPairs, wait_all
from epd.transfer.shm import map_private, segment_path
from epd.v1 import common_pb2, transfer_pb2, transfer_pb2_grpc
from epd.wire.tensors import dtype_from_proto, nbytes_of

logger = logging.getLogger(__name__)

_ACK_TIMEOUT_S = 2.0
_PULL_METHOD = "/epd.v1.Transfer/Pull"
_COPIER_MIN_BYTES = 4 << 20  # below this a copier thread costs more than the overlap saves
# What a stale cached group fails with; worth one more try on a fresh group.
_STALE_GROUP = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE)
_ACK_AFTER = (grpc.StatusCode.DATA_LOSS, grpc.StatusCode.INVALID_ARGUMENT)
_BACKENDS = (common_pb2.TRANSFER_BACKEND_GRPC, common_pb2.TRANSFER_BACKEND_SHM, common_pb2.TRANSFER_BACKEND_NCCL,
             common_pb2.TRANSFER_BACKEND_CUDA_IPC)


class TransferReceiver:
    """Fetches handles from any owner. Thread-safe; `close()` when done to close the channels.

    Large gRPC pulls land in warm buffers of a pool of `buffer_pool_bytes` (epd.transfer.buffers; 0 for
    none): a buffer is reused once nothing views the tensors fetched into it.
    """

    def __init__(
        self,
        *,
        timeout_s: float = 30.0,
        max_chunk_bytes: int = 1 << 20,
        max_channels: int = 64,
        shm_dir: str = "/dev/shm",
        device: str | torch.device = "cpu",
        buffer_pool_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"transfer timeout_s must be > 0, got {timeout_s}")
        if not MIN_CHUNK_BYTES <= max_chunk_bytes <= MAX_CHUNK_BYTES:
            raise ValueError(f"max_chunk_bytes={max_chunk_bytes} is outside [{MIN_CHUNK_BYTES}, {MAX_CHUNK_BYTES}]")
        self._timeout_s = timeout_s
        self._max_chunk_bytes = max_chunk_bytes
        self._shm_dir = shm_dir
        self._device = torch.device(device)  # where nccl receives land (gloo ones in CPU memory)
        self._pairs = PullerPairs()
        self._buffers = ReceiveBuffers(buffer_pool_bytes)  # warm memory for large pulls (epd.transfer.buffers)
        receive_limit = MAX_CHUNK_BYTES + CHUNK_HEADROOM_BYTES
        self._channels = ChannelPool(max_channels, [("grpc.max_receive_message_length", receive_limit)])
        self._acks = AckQueue(lambda item: self._ack(*item))  # (handle, the fetch's trace metadata)

    def fetch(
        self,
        handle: common_pb2.TransferHandle,
        metas: Sequence[common_pb2.TensorMeta],
        kind: str,
        timeout_s: float | None = None,
    ) -> list[tuple[str, torch.Tensor]]:
        """The (name, tensor) pairs behind `handle`, in meta order: writable CPU tensors that alias nothing of
        the owner's (shm ones view a private, copy-on-write mapping of its segment).

        `metas` are the ones that travelled with the handle (EmbeddingRef.tensors, KvRef.tensors).
        Raises TransferError (see its codes) and ValueError for an unknown kind.
        """
        check_kind(kind)
        timeout = self._timeout_s if timeout_s is None else timeout_s
        nbytes = self._check_request(handle, metas)
        started = time.monotonic()
        try:
            tensors, backend = self._transfer(handle, metas, nbytes, started + timeout)
        except TransferError as err:
            if err.code in _ACK_AFTER:
                self._ack(handle)
            raise
        elapsed = time.monotonic() - started
        # The tensors are ours now: no need to wait for the owner (epd.transfer.acks).
        self._acks.submit((handle, tracing.current_metadata()))
        TRANSFER_BYTES.labels(kind=kind, backend=backend).inc(handle.size_bytes)
        TRANSFER_SECONDS.labels(kind=kind, backend=backend).observe(elapsed)
        return [(meta.name, tensor) for meta, tensor in zip(metas, tensors, strict=True)]

    def release(self, handle: common_pb2.TransferHandle) -> bool:
        """Ack a handle without fetching it (e.g. the data is already cached); False if not released.

        Never raises for a peer problem: a lost ack only means the owner frees the bytes at the TTL.
        """
        return self._ack(handle)

    def wait_for_acks(self, timeout_s: float = _ACK_TIMEOUT_S) -> bool:
        """True once every fetch's ack has been answered (the owner has freed what it can); False on timeout."""
        return self._acks.wait(timeout_s)

    def close(self) -> None:
        """Let pending acks land (bounded), then close every channel (cancelling fetches still running on them)
        and drop every group."""
        self._acks.close(_ACK_TIMEOUT_S)
        self._buffers.clear()
        self._channels.close()
        self._pairs.close()

    def group_backend(self, owner_address: str) -> str | None:
        """"nccl" or "gloo": what carries nccl handles from this owner now; None when no group is up."""
        return self._pairs.backend(owner_address)

    def _check_request(self, handle: common_pb2.TransferHandle, metas: Sequence[common_pb2.TensorMeta]) -> list[int]:
        def invalid(message: str) -> TransferError:
            return TransferError(grpc.StatusCode.INVALID_ARGUMENT, message, handle_id=handle.handle_id,
                                 owner_address=handle.owner_address)

        if handle.backend not in _BACKENDS:
            raise invalid(f"backend {common_pb2.TransferBackend.Name(handle.backend)} is not served by this receiver")
        if not handle.handle_id or not handle.owner_address:
            raise invalid("handle has no handle_id or no owner_address")
        try:
            nbytes = [nbytes_of(meta) for meta in metas]
            if handle.backend == common_pb2.TRANSFER_BACKEND_SHM:
                segment_path(self._shm_dir, handle.shm_segment_name)
        except ValueError as err:
            raise invalid(str(err)) from None
        if sum(nbytes) != handle.size_bytes:
            raise invalid(f"tensor metadata adds up to {sum(nbytes)} bytes, the handle holds {handle.size_bytes}")
        return nbytes

    def _transfer(
        self, handle: common_pb2.TransferHandle, metas: Sequence[common_pb2.TensorMeta], nbytes: list[int],
        deadline: float,
    ) -> tuple[list[torch.Tensor], str]:
        """The tensors and the backend label they actually came through."""
        if handle.backend == common_pb2.TRANSFER_BACKEND_NCCL:
            return self._receive_group(handle, metas, nbytes, deadline), "nccl"
        if handle.backend == common_pb2.TRANSFER_BACKEND_CUDA_IPC:
            if torch.cuda.is_available():
                return self._open_ipc(handle, metas, deadline), "cuda_ipc"
            logger.warning("no CUDA here for cuda_ipc handle %s; pulling it over gRPC from %s", handle.handle_id,
                           handle.owner_address)
        if handle.backend == common_pb2.TRANSFER_BACKEND_SHM:
            try:
                return self._copy_shm(handle, metas, nbytes), "shm"
            except OSError as err:  # not on this host, or already freed: Pull knows which
                logger.warning("cannot open shm segment %s (%s); pulling handle %s over gRPC from %s",
                               handle.shm_segment_name, err, handle.handle_id, handle.owner_address)
        return self._pull(handle, metas, nbytes, deadline), "grpc"

    def _copy_shm(
        self, handle: common_pb2.TransferHandle, metas: Sequence[common_pb2.TensorMeta], nbytes: list[int]
    ) -> list[torch.Tensor]:
        """Views of a private mapping of the segment, no copy; OSError if it cannot be opened.

        The owner frees the segment at our ack; the mapping keeps its pages until the last view is freed.
        """
        path = segment_path(self._shm_dir, handle.shm_segment_name)
        size, expected = os.stat(path).st_size, shm_segment_bytes(nbytes)
        if size != expected:
            raise self._data_loss(handle, f"segment {handle.shm_segment_name} has {size} bytes, its layout needs "
                                          f"{expected}")
        mapped = map_private(path, expected)  # [expected] uint8
        tensors = []
        for meta, offset, count in zip(metas, shm_layout(nbytes), nbytes, strict=True):
            dtype = dtype_from_proto(meta.dtype)
            if count:  # offsets are 64-byte aligned, so every dtype can view its slice in place
                tensor = mapped[offset:offset + count].view(dtype).reshape(tuple(meta.shape))
            else:
                tensor = torch.empty(tuple(meta.shape), dtype=dtype)
            if not check_bool(tensor):
                raise self._data_loss(handle, f"tensor {meta.name!r}: bool data holds bytes other than 0 and 1")
            tensors.append(tensor)
        return tensors

    def _pull(
        self, handle: common_pb2.TransferHandle, metas: Sequence[common_pb2.TensorMeta], nbytes: list[int],
        deadline: float,
    ) -> list[torch.Tensor]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TransferError(grpc.StatusCode.DEADLINE_EXCEEDED, "no time left to pull", handle_id=handle.handle_id,
                                owner_address=handle.owner_address)
        pull = self._channels.get(handle.owner_address).unary_stream(
            _PULL_METHOD, request_serializer=transfer_pb2.PullRequest.SerializeToString,
            response_deserializer=decode_chunk, _registered_method=True)  # data as views, no protobuf copy
        request = transfer_pb2.PullRequest(handle_id=handle.handle_id, max_chunk_bytes=self._max_chunk_bytes)
        copier = Copier() if handle.size_bytes >= _COPIER_MIN_BYTES else None
        assembler = PullAssembler(metas, nbytes, handle.handle_id, handle.owner_address,
                                  **({"copy": copier.copy} if copier else {}), empty=self._buffers.tensor)
        stream = pull(request, timeout=remaining, metadata=tracing.current_metadata())
        try:
            for chunk in stream:
                assembler.add(chunk)
        except grpc.RpcError as err:
            raise _from_rpc(err, handle, "pull") from None
        except TransferError:
            stream.cancel()  # stop the owner streaming bytes we will not use
            raise
        finally:
            if copier is not None:
                copier.close()  # every queued copy done (or, on an error, done with and dropped)
        return assembler.finish()

    def _receive_group(
        self, handle: common_pb2.TransferHandle, metas: Sequence[common_pb2.TensorMeta], nbytes: list[int],
        deadline: float,
    ) -> list[torch.Tensor]:
        """The tensors over the pair's group with the owner, joining one first if there is none.

        A cached group may have gone stale (the owner dropped or evicted it, or restarted): one that
        fails is dropped and the transfer tried once more on a fresh group. A dead owner then fails
        the rendezvous at once.
        """
        stale_ok = True
        while True:
            pair = self._pair(handle, deadline)
            reused = pair.transfers > 0
            try:
                return self._receive_on(pair, handle, metas, nbytes, deadline)
            except TransferError as err:
                if not (reused and stale_ok) or err.code not in _STALE_GROUP:
                    raise
                logger.info("group with %s failed (%s); trying a new one", handle.owner_address, err)
                stale_ok = False

    def _receive_on(
        self, pair, handle: common_pb2.TransferHandle, metas: Sequence[common_pb2.TensorMeta], nbytes: list[int],
        deadline: float,
    ) -> list[torch.Tensor]:
        """Post a receive per non-empty tensor, then ask the owner to send (Transfer.Send); any failure
        drops the group (receives may still be posted on it) and names the owner."""
        stub = transfer_pb2_grpc.TransferStub(self._channels.get(handle.owner_address))
        where = {"handle_id": handle.handle_id, "owner_address": handle.owner_address}
        device = self._device if pair.backend == "nccl" else torch.device("cpu")
        tensors = [torch.empty(tuple(meta.shape), dtype=dtype_from_proto(meta.dtype), device=device) for meta in metas]
        call = None
        try:
            with pair.lock:
                tag = pair.take_tags(len(metas))
                works = [pair.group.recv([tensor.reshape(-1).view(torch.uint8)], OWNER_RANK, tag + i)
                         for i, (tensor, count) in enumerate(zip(tensors, nbytes, strict=True)) if count]
                call = stub.Send.future(transfer_pb2.SendRequest(handle_id=handle.handle_id, group_id=pair.group_id,
                                                                 tag=tag), timeout=self._remaining(deadline, where))
                # The Send call fails at once when the owner dies: watched while the receives wait.
                wait_all(works, self._remaining(deadline, where), lambda: call.done() and call.exception())
                call.result()
        except BaseException as err:
            self._pairs.drop(handle.owner_address, pair)
            if isinstance(err, grpc.RpcError):
                raise _from_rpc(err, handle, "send") from None
            if isinstance(err, Exception) and not isinstance(err, TransferError):  # the backend gave up
                if call is not None:
                    call.cancel()
                raise _group_error(call, err, handle) from None
            raise
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the receives have landed before anyone reads the tensors
        for meta, tensor in zip(metas, tensors, strict=True):
            if not check_bool(tensor):
                raise self._data_loss(handle, f"tensor {meta.name!r}: bool data holds bytes other than 0 and 1")
        return tensors

    def _pair(self, handle: common_pb2.TransferHandle, deadline: float):
        """The cached group with the handle's owner, or a new one (Transfer.Rendezvous, then both ranks join)."""
        where = {"handle_id": handle.handle_id, "owner_address": handle.owner_address}
        stub = transfer_pb2_grpc.TransferStub(self._channels.get(handle.owner_address))

        def rendezvous(backends: list[str], timeout_s: float) -> transfer_pb2.RendezvousResponse:
            return stub.Rendezvous(transfer_pb2.RendezvousRequest(backends=backends), timeout=timeout_s)

        try:
            return self._pairs.get(handle.owner_address, rendezvous, self._remaining(deadline, where))
        except grpc.RpcError as err:
            raise _from_rpc(err, handle, "rendezvous") from None
        except TransferError:
            raise
        except Exception as err:  # the store or the group could not be joined in time
            raise TransferError(grpc.StatusCode.UNAVAILABLE, f"joining a group failed: {err}", **where) from None

    def _open_ipc(self, handle: common_pb2.TransferHandle, metas: Sequence[common_pb2.TensorMeta],
                  deadline: float) -> list[torch.Tensor]:
        """Map the owner's GPU memory, copy it out (finished before returning), so the ack may free it."""
        from epd.transfer.cuda_ipc import open_and_copy

        where = {"handle_id": handle.handle_id, "owner_address": handle.owner_address}
        stub = transfer_pb2_grpc.TransferStub(self._channels.get(handle.owner_address))
        try:
            reply = stub.ExportIpc(transfer_pb2.ExportIpcRequest(handle_id=handle.handle_id),
                                   timeout=self._remaining(deadline, where))
        except grpc.RpcError as err:
            raise _from_rpc(err, handle, "export") from None
        device = self._device if self._device.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
        try:
            return open_and_copy(reply.tensors, metas, device)
        except ValueError as err:
            raise TransferError(grpc.StatusCode.DATA_LOSS, str(err), **where) from None
        except (LookupError, RuntimeError) as err:  # another node's GPU, or CUDA refused the handle
            raise TransferError(grpc.StatusCode.FAILED_PRECONDITION, f"cannot open CUDA IPC handles: {err}",
                                **where) from None

    @staticmethod
    def _remaining(deadline: float, where: dict) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TransferError(grpc.StatusCode.DEADLINE_EXCEEDED, "no time left for the transfer", **where)
        return remaining

    def _ack(self, handle: common_pb2.TransferHandle, metadata: tuple = ()) -> bool:
        stub = transfer_pb2_grpc.TransferStub(self._channels.get(handle.owner_address))
        try:
            reply = stub.Release(transfer_pb2.ReleaseRequest(handle_id=handle.handle_id), timeout=_ACK_TIMEOUT_S,
                                 metadata=metadata or None)
        except grpc.RpcError as err:
            logger.warning("%s; the owner frees it at its TTL", _from_rpc(err, handle, "release"))
            return False
        if not reply.released:
            logger.debug("handle %s on %s was already freed when acked", handle.handle_id, handle.owner_address)
        return reply.released

    @staticmethod
    def _data_loss(handle: common_pb2.TransferHandle, message: str) -> TransferError:
        return TransferError(grpc.StatusCode.DATA_LOSS, message, handle_id=handle.handle_id,
                             owner_address=handle.owner_address)


def _group_error(call: grpc.Future | None, err: Exception, handle: common_pb2.TransferHandle) -> TransferError:
    """The owner's own status when its Send already failed; else UNAVAILABLE (it died) or DEADLINE_EXCEEDED."""
    where = {"handle_id": handle.handle_id, "owner_address": handle.owner_address}
    if call is not None and call.done() and not call.cancelled() and call.exception() is not None:
        return _from_rpc(call.exception(), handle, "send")
    code = grpc.StatusCode.DEADLINE_EXCEEDED if isinstance(err, TimeoutError) else grpc.StatusCode.UNAVAILABLE
    return TransferError(code, f"receiving over the group failed: {err}", **where)


def _from_rpc(err: grpc.RpcError, handle: common_pb2.TransferHandle, what: str) -> TransferError:
    """The TransferError for a failed call, keeping the peer's status code and details."""
    code = err.code() if isinstance(err, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = err.details() if isinstance(err, grpc.Call) else str(err)
    return TransferError(code, f"{what} failed with {code.name}: {details}", handle_id=handle.handle_id,
                         owner_address=handle.owner_address)
