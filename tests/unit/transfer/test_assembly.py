"""PullAssembler: how a receiver checks a Pull stream against the metadata it expects (pure, no server)."""

from __future__ import annotations

import grpc
import pytest
import torch

from epd.transfer import (
    TransferError,
)
from epd.transfer.assembly import PullAssembler
from epd.v1 import common_pb2, transfer_pb2
from epd.wire.tensors import meta_of

BACKENDS = ["grpc", "shm"]
BIG_SHAPE = (1024, 800)  # float32: 3,276,800 bytes > 3 MiB, i.e. 13 chunks of 256 KiB
SMALL_CHUNK = 256 << 10


def _chunk(data: bytes, offset: int = 0, meta: common_pb2.TensorMeta | None = None) -> transfer_pb2.PullChunk:
    return transfer_pb2.PullChunk(meta=meta, offset_bytes=offset, data=data)


def _assembler() -> tuple[PullAssembler, common_pb2.TensorMeta, common_pb2.TensorMeta]:
    first, second = meta_of("a", torch.zeros(4, dtype=torch.uint8)), meta_of("b", torch.zeros(2, dtype=torch.bool))
    return PullAssembler([first, second], [4, 2], "h1", "host:1"), first, second


def test_assembler_accepts_a_valid_stream():
    asm, first, second = _assembler()
    for chunk in (_chunk(b"\x01\x02", 0, first), _chunk(b"\x03\x04", 2), _chunk(b"\x00\x01", 0, second)):
        asm.add(chunk)
    a, b = asm.finish()
    assert a.tolist() == [1, 2, 3, 4] and b.tolist() == [False, True]


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        (lambda f, s: [_chunk(b"\x01")], "carries no tensor meta"),
        (lambda f, s: [_chunk(b"\x01", 0, f), _chunk(b"\x03", 2)], "chunk at byte 2, expected 1"),
        (lambda f, s: [_chunk(b"\x01\x02\x03\x04\x05", 0, f)], "ends at byte 5, past its 4 bytes"),
        (lambda f, s: [_chunk(b"\x01\x02", 0, f), _chunk(b"", 0, s)], "got 2 of 4 bytes"),
        (lambda f, s: [_chunk(b"\x01\x02\x03\x04", 0, f)], "after 1 of 2 tensors"),
        (lambda f, s: [_chunk(b"\x01\x02\x03\x04", 0, s)], "tensor 0 is 'b'"),
        (lambda f, s: [_chunk(b"1234", 0, f), _chunk(b"\x00\x01", 0, s), _chunk(b"", 0, s)], "beyond the 2"),
        (lambda f, s: [_chunk(b"1234", 0, f), _chunk(b"\x00\x07", 0, s)], "bytes other than 0 and 1"),
    ],
)
def test_assembler_rejects_streams_that_break_the_metadata(chunks, message):
    asm, first, second = _assembler()
    with pytest.raises(TransferError) as info:
        for chunk in chunks(first, second):
            asm.add(chunk)
        asm.finish()
    assert info.value.code == grpc.StatusCode.DATA_LOSS
    assert message in str(info.value) and "'h1'" in str(info.value) and "host:1" in str(info.value)
