"""Tensor <-> `epd.v1.Tensor`: raw little-endian C-contiguous bytes plus name, dtype and shape.

Never `repeated float`, never pickle. bfloat16 has no numpy type, so every dtype travels as its raw
bytes and is reinterpreted on arrival; the round trip is bit-exact.
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

if sys.byteorder != "little":  # the wire format is little-endian; so is every platform we run on
    raise ImportError("epd.wire.tensors assumes a little-endian host")


def dtype_to_proto(dtype: torch.dtype) -> int:
    try:
        return _TO_PROTO[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} cannot go on the wire; supported: {sorted(map(str, _TO_PROTO))}") from None


def dtype_from_proto(value: int) -> torch.dtype:
    try:
        return _FROM_PROTO[value]
    except KeyError:
        name = common_pb2.DType.Name(value) if value in common_pb2.DType.values() else str(value)
        raise ValueError(f"tensor dtype {name} is not a supported element type") from None


def meta_of(name: str, tensor: torch.Tensor) -> common_pb2.TensorMeta:
    return common_pb2.TensorMeta(name=name, dtype=dtype_to_proto(tensor.dtype), shape=list(tensor.shape))


def tensor_to_proto(name: str, tensor: torch.Tensor) -> common_pb2.Tensor:
    """Copy a (CPU or device) tensor into an inline `Tensor` message."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)  # [numel]
    raw = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)  # [numel * itemsize]
    return common_pb2.Tensor(meta=meta_of(name, tensor), data=raw.numpy().tobytes())


def tensor_from_proto(message: common_pb2.Tensor) -> torch.Tensor:
    """A fresh, writable tensor from an inline `Tensor` message; ValueError on inconsistent metadata."""
    meta = message.meta
    dtype = dtype_from_proto(meta.dtype)
    shape = tuple(int(d) for d in meta.shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"tensor {meta.name!r} has a negative dimension in shape {list(shape)}")
    itemsize = torch.empty(0, dtype=dtype).element_size()
    expected = math.prod(shape) * itemsize
    if len(message.data) != expected:
        raise ValueError(
            f"tensor {meta.name!r}: {len(message.data)} bytes do not match shape {list(shape)} of "
            f"{dtype} ({expected} bytes)"
        )
    if expected == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.frombuffer(bytearray(message.data), dtype=torch.uint8)  # [nbytes], owns its copy
    return raw.view(dtype).reshape(shape)
