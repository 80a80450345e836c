"""The PullChunk wire format, encoded and decoded by hand on the hot path (one copy fewer on each side).

protobuf's own codecs copy a chunk's data once more than needed: `SerializeToString` needs the data
as `bytes` first (a copy out of the tensor) and then copies it into the message, and `FromString`
copies it out of the received bytes into a new `bytes`. Here the sender writes header + data in one
join straight from the tensor's memory, and the receiver gets the data as a memoryview into the
received message. The bytes on the wire are a valid `epd.v1.PullChunk` either way; anything this
decoder does not expect (unknown fields, repeated fields, other wire types) goes to protobuf's parser,
so the hand-written path can only be faster, never more permissive.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError

from epd.v1 import common_pb2, transfer_pb2

_META, _OFFSET, _DATA = 1, 2, 3
_LEN, _VARINT = 2, 0


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 on the wire: two's complement in ten bytes
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_chunk(meta: common_pb2.TensorMeta | None, offset_bytes: int, data) -> bytes:
    """A serialized PullChunk: `meta` (first chunk of a tensor) or None, the offset, and `data` (any buffer)."""
    view = memoryview(data).cast("B")
    header = b""
    if meta is not None:
        meta_bytes = meta.SerializeToString()
        header = bytes([_META << 3 | _LEN]) + _varint(len(meta_bytes)) + meta_bytes
    if offset_bytes:
        header += bytes([_OFFSET << 3 | _VARINT]) + _varint(offset_bytes)
    if not len(view):
        return header
    return b"".join((header, bytes([_DATA << 3 | _LEN]), _varint(len(view)), view))


@dataclass(slots=True)
class Chunk:
    """A decoded PullChunk with the interface PullAssembler reads; `data` is a view into the message."""

    meta: common_pb2.TensorMeta | None
    offset_bytes: int
    data: memoryview | bytes

    def HasField(self, name: str) -> bool:  # noqa: N802 - the protobuf message's spelling
        if name != "meta":
            raise ValueError(f"Chunk has no optional field {name!r}")
        return self.meta is not None


def _read_varint(raw: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(raw) or shift > 63:
            raise ValueError("bad varint")
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def decode_chunk(message: bytes) -> Chunk:
    """Parse a serialized PullChunk (a gRPC response deserializer)."""
    try:
        return _decode_fast(message)
    except (ValueError, DecodeError):
        parsed = transfer_pb2.PullChunk.FromString(message)  # the general parser decides (and raises)
        return Chunk(parsed.meta if parsed.HasField("meta") else None, parsed.offset_bytes, parsed.data)


def _decode_fast(message: bytes) -> Chunk:
    raw = memoryview(message)
    pos, seen = 0, set()
    meta, offset, data = None, 0, raw[0:0]
    while pos < len(raw):
        key, pos = _read_varint(raw, pos)
        field, wire = key >> 3, key & 7
        if field in seen or (field, wire) not in ((_META, _LEN), (_OFFSET, _VARINT), (_DATA, _LEN)):
            raise ValueError("not the plain encoding")  # repeated or unknown: let protobuf handle it
        seen.add(field)
        if wire == _VARINT:
            offset, pos = _read_varint(raw, pos)
            if offset >= 1 << 63:
                offset -= 1 << 64
            continue
        length, pos = _read_varint(raw, pos)
        if pos + length > len(raw):
            raise ValueError("truncated field")
        if field == _META:
            meta = common_pb2.TensorMeta.FromString(raw[pos:pos + length].tobytes())
        else:
            data = raw[pos:pos + length]
        pos += length
    return Chunk(meta, offset, data)
