"""Tensor <-> `epd.v1.Tensor`: raw little-endian C-contiguous bytes plus name, dtype and shape.

Never `repeated float`, never pickle. bfloat16 (and fp8) have no numpy type, so every dtype travels
as its raw bytes and is reinterpreted on arrival; the round trip is bit-exact. Decoding errors are
`ValueError`s naming the tensor, which servicers turn into INVALID_ARGUMENT.
"""

from __future__ import annotations

import math
import sys

import torch

from epd.v1 import common_pb2

_TO_PROTO: dict[torch.dtype, int] = {
    torch.float32: common_pb2.DTYPE_FLOAT32,
    torch.float16: common_pb2.DTYPE_FLOAT16,
    torch.bfloat16: common_pb2.DTYPE_BFLOAT16,
    torch.float64: common_pb2.DTYPE_FLOAT64,
    torch.int64: common_pb2.DTYPE_INT64,
    torch.int32: common_pb2.DTYPE_INT32,
    torch.int16: common_pb2.DTYPE_INT16,
    torch.int8: common_pb2.DTYPE_INT8,
    torch.uint8: common_pb2.DTYPE_UINT8,
    torch.bool: common_pb2.DTYPE_BOOL,
    torch.float8_e4m3fn: common_pb2.DTYPE_FLOAT8_E4M3FN,
    torch.float8_e5m2: common_pb2.DTYPE_FLOAT8_E5M2,
}
_FROM_PROTO: dict[int, torch.dtype] = {v: k for k, v in _TO_PROTO.items()}

# The wire is little-endian and we ship native bytes; refuse to run where that would be wrong.
if sys.byteorder != "little":
    raise ImportError("epd.wire.tensors assumes a little-endian host")


def dtype_to_proto(dtype: torch.dtype) -> int:
    """`epd.v1.DType` value of a torch dtype; ValueError if it has none."""
    try:
        return _TO_PROTO[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} cannot go on the wire; supported: {sorted(map(str, _TO_PROTO))}") from None


def dtype_from_proto(value: int) -> torch.dtype:
    """torch dtype of an `epd.v1.DType` value; ValueError for UNSPECIFIED or unknown values."""
    try:
        return _FROM_PROTO[value]
    except KeyError:
        name = common_pb2.DType.Name(value) if value in common_pb2.DType.values() else str(value)
        raise ValueError(f"tensor dtype {name} is not a supported element type") from None


def meta_of(name: str, tensor: torch.Tensor) -> common_pb2.TensorMeta:
    """Name, wire dtype and shape of `tensor` (no data)."""
    return common_pb2.TensorMeta(name=name, dtype=dtype_to_proto(tensor.dtype), shape=list(tensor.shape))


def nbytes_of(meta: common_pb2.TensorMeta) -> int:
    """Payload size the metadata promises: prod(shape) * itemsize; ValueError if the meta is invalid."""
    dtype = dtype_from_proto(meta.dtype)
    if any(d < 0 for d in meta.shape):
        raise ValueError(f"tensor {meta.name!r} has a negative dimension in shape {list(meta.shape)}")
    return math.prod(meta.shape) * dtype.itemsize


def tensor_to_bytes(tensor: torch.Tensor) -> bytes:
    """Raw C-contiguous element bytes of a (CPU or device) tensor."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)  # [numel]; reshape makes 0-d viewable
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).numpy().tobytes()  # [numel * itemsize]


def tensor_from_bytes(meta: common_pb2.TensorMeta, data: bytes | bytearray | memoryview) -> torch.Tensor:
    """A fresh, writable CPU tensor from metadata and raw bytes; ValueError if they disagree."""
    expected = nbytes_of(meta)
    dtype, shape = _FROM_PROTO[meta.dtype], tuple(meta.shape)
    if len(data) != expected:
        raise ValueError(
            f"tensor {meta.name!r}: {len(data)} bytes do not match shape {list(shape)} of {dtype} "
            f"({expected} bytes)"
        )
    if expected == 0:  # torch.frombuffer rejects an empty buffer
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(bytearray(data), dtype=torch.uint8)  # [nbytes]; owns its copy, writable
    if dtype == torch.bool and bool((raw > 1).any()):
        raise ValueError(f"tensor {meta.name!r}: bool data holds bytes other than 0 and 1")
    return raw.view(dtype).reshape(shape)


def tensor_to_proto(name: str, tensor: torch.Tensor) -> common_pb2.Tensor:
    """Copy a (CPU or device) tensor into an inline `Tensor` message."""
    return common_pb2.Tensor(meta=meta_of(name, tensor), data=tensor_to_bytes(tensor))


def tensor_from_proto(message: common_pb2.Tensor) -> torch.Tensor:
    """A fresh, writable tensor from an inline `Tensor` message; ValueError on inconsistent metadata."""
    return tensor_from_bytes(message.meta, message.data)
