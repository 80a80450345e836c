"""The Transfer gRPC service: Pull streams a lease's tensors in chunks, Release is the receiver's ack.

Thin: look the handle up in the TransferSender, stream or free, map "not there" to NOT_FOUND.
Any lease streams, shm-backed ones included, so Pull is also the fallback for an shm handle whose
segment the receiver cannot see (another host).
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from epd.transfer.layout import chunk_bytes
from epd.transfer.payload import ByteReader, SourceGone
from epd.transfer.sender import TransferSender
from epd.v1 import common_pb2, transfer_pb2, transfer_pb2_grpc


def tensor_chunks(
    reader: ByteReader, index: int, meta: common_pb2.TensorMeta, nbytes: int, chunk: int
) -> Iterator[transfer_pb2.PullChunk]:
    """Chunks of one tensor; the first carries `meta`, even for a zero-byte tensor (then with no data)."""
    yield transfer_pb2.PullChunk(meta=meta, offset_bytes=0, data=reader.read(index, 0, min(chunk, nbytes)))
    for start in range(chunk, nbytes, chunk):
        yield transfer_pb2.PullChunk(offset_bytes=start, data=reader.read(index, start, min(start + chunk, nbytes)))


class TransferServicer(transfer_pb2_grpc.TransferServicer):
    """Serves the leases of one TransferSender."""

    def __init__(self, sender: TransferSender) -> None:
        self._sender = sender

    def Pull(
        self, request: transfer_pb2.PullRequest, context: grpc.ServicerContext
    ) -> Iterator[transfer_pb2.PullChunk]:
        lease = self._sender.lookup(request.handle_id)
        if lease is None:
            context.abort(grpc.StatusCode.NOT_FOUND, self._gone(request.handle_id, "is unknown or its lease expired"))
        chunk = chunk_bytes(request.max_chunk_bytes)
        try:
            with lease.source.open_reader() as reader:
                for index, (meta, nbytes) in enumerate(zip(lease.metas, lease.nbytes, strict=True)):
                    yield from tensor_chunks(reader, index, meta, nbytes, chunk)
        except SourceGone:  # released or expired between lookup and open
            context.abort(grpc.StatusCode.NOT_FOUND, self._gone(request.handle_id, "was released before streaming"))

    def Release(
        self, request: transfer_pb2.ReleaseRequest, context: grpc.ServicerContext
    ) -> transfer_pb2.ReleaseResponse:
        return transfer_pb2.ReleaseResponse(released=self._sender.release(request.handle_id))

    def _gone(self, handle_id: str, why: str) -> str:
        return f"transfer handle {handle_id!r} on {self._sender.owner_address} {why}"


def add_transfer_service(server: grpc.Server, sender: TransferSender) -> TransferServicer:
    """Register the Transfer service for `sender` on `server` (before `server.start()`)."""
    servicer = TransferServicer(sender)
    transfer_pb2_grpc.add_TransferServicer_to_server(servicer, server)
    return servicer
