"""The Transfer gRPC service: Pull streams a lease's tensors in chunks, Release is the receiver's ack,
Rendezvous and Send are the nccl backend's side channel (the bytes go over the pair's group).

Thin: look the handle up in the TransferSender, stream or free, map "not there" to NOT_FOUND.
Any lease streams, shm-backed ones included, so Pull is also the fallback for an shm handle whose
segment the receiver cannot see (another host).
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from epd.transfer.chunks import encode_chunk
from epd.transfer.layout import chunk_bytes
from epd.transfer.payload import ByteReader, MemorySource, SourceGone
from epd.transfer.sender import TransferSender
from epd.v1 import common_pb2, transfer_pb2, transfer_pb2_grpc


def tensor_chunks(
    reader: ByteReader, index: int, meta: common_pb2.TensorMeta, nbytes: int, chunk: int
) -> Iterator[bytes]:
    """Serialized PullChunks of one tensor; the first carries `meta`, even for a zero-byte tensor (then no data)."""
    yield encode_chunk(meta, 0, reader.read(index, 0, min(chunk, nbytes)))
    for start in range(chunk, nbytes, chunk):
        yield encode_chunk(None, start, reader.read(index, start, min(start + chunk, nbytes)))


class TransferServicer(transfer_pb2_grpc.TransferServicer):
    """Serves the leases of one TransferSender."""

    def __init__(self, sender: TransferSender) -> None:
        self._sender = sender

    def Pull(self, request: transfer_pb2.PullRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
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

    def Rendezvous(
        self, request: transfer_pb2.RendezvousRequest, context: grpc.ServicerContext
    ) -> transfer_pb2.RendezvousResponse:
        try:
            group_id, host, port, backend, timeout_s = self._sender.pairs().rendezvous(list(request.backends))
        except ValueError as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{self._sender.owner_address}: {err}")
        return transfer_pb2.RendezvousResponse(group_id=group_id, store_host=host, store_port=port, backend=backend,
                                               timeout_ms=round(timeout_s * 1000))

    def Send(self, request: transfer_pb2.SendRequest, context: grpc.ServicerContext) -> transfer_pb2.SendResponse:
        pairs = self._sender.pairs()
        pair = pairs.get(request.group_id)
        if pair is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"{self._sender.owner_address} has no group {request.group_id!r} (dropped or never joined)")
        lease = self._sender.lookup(request.handle_id)
        if lease is None:
            pairs.drop(request.group_id)  # the puller has posted its receives: this group is out of step now
            context.abort(grpc.StatusCode.NOT_FOUND, self._gone(request.handle_id, "is unknown or its lease expired"))
        if not isinstance(lease.source, MemorySource):
            pairs.drop(request.group_id)
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, self._gone(request.handle_id, "is in shared memory"))
        try:
            def puller_gone() -> Exception | None:
                return None if context.is_active() else ConnectionError("the puller's call ended")

            sent = pairs.send(pair, lease.source.views(), int(request.tag), puller_gone)
        except SourceGone:
            pairs.drop(request.group_id)
            context.abort(grpc.StatusCode.NOT_FOUND, self._gone(request.handle_id, "was released before sending"))
        except Exception as err:  # the puller died or timed out: its group is dropped, the lease stays to its TTL
            context.abort(grpc.StatusCode.ABORTED, self._gone(request.handle_id, f"could not be sent: {err}"))
        return transfer_pb2.SendResponse(sent_bytes=sent)

    def ExportIpc(
        self, request: transfer_pb2.ExportIpcRequest, context: grpc.ServicerContext
    ) -> transfer_pb2.ExportIpcResponse:
        lease = self._sender.lookup(request.handle_id)
        if lease is None:
            context.abort(grpc.StatusCode.NOT_FOUND, self._gone(request.handle_id, "is unknown or its lease expired"))
        try:
            from epd.transfer.cuda_ipc import export

            views = lease.source.views() if isinstance(lease.source, MemorySource) else []
            return transfer_pb2.ExportIpcResponse(tensors=export(views))
        except SourceGone:
            context.abort(grpc.StatusCode.NOT_FOUND, self._gone(request.handle_id, "was released before export"))
        except (ValueError, RuntimeError) as err:  # CPU tensors, or CUDA refused to share
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, self._gone(request.handle_id, f"cannot be exported: "
                                                                                             f"{err}"))

    def _gone(self, handle_id: str, why: str) -> str:
        return f"transfer handle {handle_id!r} on {self._sender.owner_address} {why}"


def add_transfer_service(server: grpc.Server, sender: TransferSender) -> TransferServicer:
    """Register the Transfer service for `sender` on `server` (before `server.start()`).

    As the generated `add_TransferServicer_to_server` does, except that Pull's responses are already
    serialized (see epd.transfer.chunks), so its serializer passes bytes through.
    """
    servicer = TransferServicer(sender)

    def unary(method, request, response) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(method, request_deserializer=request.FromString,
                                                   response_serializer=response.SerializeToString)

    handlers = {
        "Pull": grpc.unary_stream_rpc_method_handler(
            servicer.Pull, request_deserializer=transfer_pb2.PullRequest.FromString,
            response_serializer=_serialized),
        "Release": unary(servicer.Release, transfer_pb2.ReleaseRequest, transfer_pb2.ReleaseResponse),
        "Rendezvous": unary(servicer.Rendezvous, transfer_pb2.RendezvousRequest, transfer_pb2.RendezvousResponse),
        "Send": unary(servicer.Send, transfer_pb2.SendRequest, transfer_pb2.SendResponse),
        "ExportIpc": unary(servicer.ExportIpc, transfer_pb2.ExportIpcRequest, transfer_pb2.ExportIpcResponse),
    }
    missing = set(transfer_pb2.DESCRIPTOR.services_by_name["Transfer"].methods_by_name) - set(handlers)
    if missing:  # a new rpc in transfer.proto must be registered here too
        raise RuntimeError(f"Transfer methods without a handler: {sorted(missing)}")
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
    return servicer


SERVICE_NAME = transfer_pb2.DESCRIPTOR.services_by_name["Transfer"].full_name


def _serialized(message) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()
