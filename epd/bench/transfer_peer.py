"""The sending side of `epd bench transfer`, run in a child process so the figures cross a process boundary.

It owns a real `TransferSender` served by a real gRPC server on 127.0.0.1 and answers commands read
from stdin, replying on stdout. Both carry length-prefixed frames (4 bytes big-endian, then the
bytes: serialized protos or ASCII words), never pickled objects. Commands, one per frame:

    publish               -> serialized TransferHandle, then serialized TensorMeta (one payload tensor)
    socket PORT           -> connects to 127.0.0.1:PORT and sends the payload's bytes once (raw TCP limit)
    dist PORT REPEATS     -> joins a 2-rank group (nccl when the payload is on a GPU, else gloo) at a TCP
                             store on 127.0.0.1:PORT and sends REPEATS times
    quit
"""

from __future__ import annotations

import socket
import struct
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO


def write_frame(stream: BinaryIO, data: bytes) -> None:
    stream.write(struct.pack(">I", len(data)) + data)
    stream.flush()


def _read_exactly(stream: BinaryIO, length: int) -> bytes:
    parts, got = [], 0
    while got < length:  # an unbuffered pipe may return less than asked
        part = stream.read(length - got)
        if not part:
            raise EOFError("transfer bench peer pipe closed")
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def read_frame(stream: BinaryIO) -> bytes:
    """One frame; EOFError when the other side has gone."""
    (length,) = struct.unpack(">I", _read_exactly(stream, 4))
    return _read_exactly(stream, length)


class _Pipe:
    def __init__(self, reader: BinaryIO, writer: BinaryIO) -> None:
        self._reader, self._writer = reader, writer

    def send_bytes(self, data: bytes) -> None:
        write_frame(self._writer, data)

    def recv_bytes(self) -> bytes:
        return read_frame(self._reader)


def serve(conn, backend: str, size_bytes: int) -> None:
    """Serve commands from `conn` (send_bytes / recv_bytes) until "quit" or the pipe closes."""
    import grpc

    from epd.malloc import keep_freed_memory_warm
    from epd.transfer import TransferSender, add_transfer_service
    from epd.wire.tensors import meta_of
    from epd.worker import GRPC_OPTIONS

    keep_freed_memory_warm()  # as a worker does at start (epd.worker)
    payload = expected_payload(size_bytes).to(payload_device(backend))  # [size_bytes]
    sender = TransferSender(backend, "")
    server = grpc.server(ThreadPoolExecutor(max_workers=8), options=GRPC_OPTIONS)
    add_transfer_service(server, sender)
    sender.owner_address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    server.start()
    conn.send_bytes(f"ready {sender.owner_address}".encode())
    try:
        while True:
            words = conn.recv_bytes().decode().split()
            if words[0] == "publish":
                handle = sender.publish([("payload", payload)], "kv", ttl_s=120.0)
                conn.send_bytes(handle.SerializeToString())
                conn.send_bytes(meta_of("payload", payload).SerializeToString())
            elif words[0] == "socket":
                _send_socket(int(words[1]), payload)
            elif words[0] == "dist":
                _send_dist(int(words[1]), int(words[2]), payload)
                conn.send_bytes(b"done")
            else:
                return
    except EOFError:
        return
    finally:
        server.stop(0)
        sender.close()


def expected_payload(size_bytes: int):
    """The bytes every peer publishes: seeded, so a test can check what it received."""
    import torch

    return torch.randint(0, 256, (size_bytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(8))


def payload_device(backend: str) -> str:
    """cuda_ipc moves GPU memory; nccl does too when there is a second GPU for the receiver (NCCL refuses
    two ranks on one device); everything else, and every backend on a CPU machine, starts in CPU memory."""
    import torch

    count = torch.cuda.device_count()
    if (backend == "cuda_ipc" and count) or (backend == "nccl" and count >= 2):
        torch.cuda.set_device(0)
        return "cuda:0"
    return "cpu"


def _send_socket(port: int, payload) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(memoryview(payload.numpy()))


def _send_dist(port: int, repeats: int, payload) -> None:
    from epd.transfer.groups import OWNER_RANK, PULLER_RANK, client_store, make_group

    store = client_store("127.0.0.1", port, timeout_s=60.0)
    backend = "nccl" if payload.is_cuda else "gloo"
    group = make_group(backend, store, OWNER_RANK, timeout_s=60.0, device=payload.device if payload.is_cuda else None)
    for tag in range(repeats):
        group.send([payload], PULLER_RANK, tag).wait()


if __name__ == "__main__":  # python -m epd.bench.transfer_peer BACKEND SIZE_BYTES
    serve(_Pipe(sys.stdin.buffer, sys.stdout.buffer), sys.argv[1], int(sys.argv[2]))
