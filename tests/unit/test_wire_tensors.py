"""Tensor <-> proto round trips keep dtype, shape and every bit; bad metadata is a clear ValueError."""

from __future__ import annotations

import warnings

import pytest
import torch

from epd.v1 import common_pb2
from epd.wire.tensors import (
    dtype_from_proto,
    meta_of,
    nbytes_of,
    tensor_from_bytes,
    tensor_from_proto,
    tensor_to_proto,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16,
          torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2]


def _sample(dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(2, 3, 5, generator=gen) * 50  # [2, 3, 5]
    return values > 0 if dtype == torch.bool else values.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_is_exact(dtype):
    tensor = _sample(dtype)
    back = tensor_from_proto(tensor_to_proto("x", tensor))
    assert back.dtype == dtype and back.shape == tensor.shape
    # Compare bit patterns: torch.equal has no fp8 kernel, and bits are what must survive.
    assert torch.equal(back.view(torch.uint8), tensor.view(torch.uint8))


def test_bfloat16_bits_survive():
    tensor = torch.tensor([1.0, -2.5, 3.140625, 1e-30, float("inf")], dtype=torch.bfloat16)
    back = tensor_from_proto(tensor_to_proto("bf", tensor))
    assert torch.equal(back.view(torch.int16), tensor.view(torch.int16))


def test_non_contiguous_input_is_sent_in_logical_order():
    tensor = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()  # [4, 3], strided
    assert not tensor.is_contiguous()
    back = tensor_from_proto(tensor_to_proto("t", tensor))
    assert back.shape == (4, 3) and torch.equal(back, tensor)


def test_scalar_and_empty():
    scalar = tensor_from_proto(tensor_to_proto("s", torch.tensor(7, dtype=torch.int64)))
    assert scalar.shape == () and scalar.item() == 7
    empty = tensor_from_proto(tensor_to_proto("e", torch.empty(0, 5, dtype=torch.bfloat16)))
    assert empty.shape == (0, 5) and empty.dtype == torch.bfloat16


def test_decoded_tensor_is_writable_and_independent():
    message = tensor_to_proto("w", torch.zeros(4))
    back = tensor_from_proto(message)
    back += 1
    assert torch.equal(tensor_from_proto(message), torch.zeros(4))


def test_meta_names_dtype_and_shape():
    meta = meta_of("pooler_output", torch.zeros(6, 64, dtype=torch.bfloat16))
    assert (meta.name, meta.dtype, list(meta.shape)) == ("pooler_output", common_pb2.DTYPE_BFLOAT16, [6, 64])


def test_length_mismatch_is_rejected():
    message = tensor_to_proto("m", torch.zeros(2, 3))
    message.meta.shape[:] = [2, 4]
    with pytest.raises(ValueError, match=r"'m': 24 bytes do not match shape \[2, 4\]"):
        tensor_from_proto(message)


def test_unspecified_dtype_is_rejected():
    message = tensor_to_proto("u", torch.zeros(2))
    message.meta.dtype = common_pb2.DTYPE_UNSPECIFIED
    with pytest.raises(ValueError, match="DTYPE_UNSPECIFIED is not a supported"):
        tensor_from_proto(message)
    with pytest.raises(ValueError, match="99"):
        dtype_from_proto(99)


def test_negative_dimension_is_rejected():
    message = tensor_to_proto("n", torch.zeros(0))
    message.meta.shape[:] = [-1]
    with pytest.raises(ValueError, match="negative dimension"):
        tensor_from_proto(message)


def test_unsupported_dtype_cannot_be_sent():
    with pytest.raises(ValueError, match="cannot go on the wire"):
        tensor_to_proto("c", torch.zeros(2, dtype=torch.complex64))


def test_survives_serialization_without_warnings():
    tensor = _sample(torch.bfloat16)
    wire = tensor_to_proto("s", tensor).SerializeToString()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. torch's "non-writable buffer" UserWarning
        back = tensor_from_proto(common_pb2.Tensor.FromString(wire))
    assert torch.equal(back.view(torch.int16), tensor.view(torch.int16))


def test_from_bytes_accepts_memoryview_and_nbytes_matches():
    tensor = torch.arange(6, dtype=torch.int32).reshape(2, 3)  # [2, 3]
    meta = meta_of("kv", tensor)
    assert nbytes_of(meta) == 24
    back = tensor_from_bytes(meta, memoryview(tensor_to_proto("kv", tensor).data))
    assert torch.equal(back, tensor)


def test_bool_bytes_other_than_0_1_are_rejected():
    message = tensor_to_proto("b", torch.tensor([True, False]))
    message.data = bytes([1, 2])
    with pytest.raises(ValueError, match="bool data"):
        tensor_from_proto(message)
