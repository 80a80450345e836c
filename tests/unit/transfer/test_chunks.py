"""The hand-written PullChunk codec agrees with protobuf's both ways, falls back to it for anything
unusual, and a pull large enough for the copier thread is still bit-exact."""

from __future__ import annotations

import pytest
import torch

from epd.transfer.assembly import Copier
from epd.transfer.chunks import decode_chunk, encode_chunk
from epd.v1 import common_pb2, transfer_pb2
from tests.unit.transfer.helpers import assert_bit_equal, metas_of

META = common_pb2.TensorMeta(name="k", dtype=common_pb2.DTYPE_BFLOAT16, shape=[2, 3])


@pytest.mark.parametrize(("meta", "offset", "data"), [
    (META, 0, b"\x01\x02\x03"), (None, 1 << 20, bytes(range(256)) * 9), (META, 0, b""), (None, 0, b""),
    (None, (1 << 40) + 5, b"\x00"),
])
def test_encoding_is_a_valid_pull_chunk_and_decodes_back(meta, offset, data):
    wire = encode_chunk(meta, offset, memoryview(data))
    parsed = transfer_pb2.PullChunk.FromString(wire)
    assert parsed.HasField("meta") == (meta is not None) and parsed.offset_bytes == offset and parsed.data == data
    if meta is not None:
        assert parsed.meta == meta
    chunk = decode_chunk(wire)
    assert chunk.HasField("meta") == (meta is not None) and chunk.offset_bytes == offset
    assert bytes(chunk.data) == data and (meta is None or chunk.meta == meta)


def test_protobuf_encodings_decode_the_same_including_unknown_and_repeated_fields():
    message = transfer_pb2.PullChunk(meta=META, offset_bytes=7, data=b"abc")
    chunk = decode_chunk(message.SerializeToString())
    assert chunk.meta == META and chunk.offset_bytes == 7 and bytes(chunk.data) == b"abc"
    unknown = message.SerializeToString() + bytes([9 << 3 | 0, 1])  # field 9, varint 1: the fallback parses it
    assert bytes(decode_chunk(unknown).data) == b"abc"
    repeated = message.SerializeToString() + transfer_pb2.PullChunk(data=b"z").SerializeToString()
    assert bytes(decode_chunk(repeated).data) == b"z"  # protobuf's rule: the last one wins
    with pytest.raises(Exception):  # noqa: B017 - protobuf's DecodeError, whatever its module
        decode_chunk(b"\x1a\x05ab")  # data field claims 5 bytes, has 2


def test_copier_copies_everything_before_close():
    import numpy as np

    target = np.zeros(1000, dtype=np.uint8)
    copier = Copier(depth=2)
    for start in range(0, 1000, 100):
        copier.copy(target[start:start + 100], bytes([start // 100]) * 100)
    copier.close()
    assert (target == np.repeat(np.arange(10, dtype=np.uint8), 100)).all()


def test_a_pull_large_enough_for_the_copier_is_bit_exact(make_owner, receiver):
    owner = make_owner("grpc")
    tensors = [("big", torch.randn(1536, 1024)), ("tail", torch.arange(5, dtype=torch.int64))]  # 6 MiB + 40 B
    got = receiver.fetch(owner.publish(tensors, "kv", ttl_s=30.0), metas_of(tensors), "kv")
    assert_bit_equal(got, tensors)
