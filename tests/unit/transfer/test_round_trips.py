"""Transfer round trips over a real loopback gRPC server, every backend (nccl on gloo here): bit-exact for every awkward
tensor (bf16, bool, 0-d, empty, strided, multi-chunk), the chunk contract, the shm layout and fallback."""

from __future__ import annotations

import os

import grpc
import pytest
import torch

from epd.transfer import (
    TransferReceiver,
    chunk_bytes,
    shm_layout,
    shm_segment_bytes,
)
from epd.v1 import common_pb2, transfer_pb2, transfer_pb2_grpc
from epd.wire.tensors import meta_of, nbytes_of, tensor_to_bytes
from tests.unit.transfer.helpers import (
    BACKENDS,
    BIG_SHAPE,
    SMALL_CHUNK,
    ReleaseCounter,
    assert_bit_equal,
    metas_of,
    my_segments,
    payload,
    sample,
)

BACKEND_ENUMS = {"grpc": common_pb2.TRANSFER_BACKEND_GRPC, "nccl": common_pb2.TRANSFER_BACKEND_NCCL}


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_trip_is_bit_exact_and_frees_the_lease(make_owner, receiver, backend):
    owner = make_owner(backend)
    tensors = payload()
    leases0, segs0 = sample("epd_leases_active", kind="embedding"), sample("epd_shm_segments_active")
    bytes0 = sample("epd_transfer_bytes_total", kind="embedding", backend=backend)
    count0 = sample("epd_transfer_seconds_count", kind="embedding", backend=backend)
    released = ReleaseCounter()

    handle = owner.publish(tensors, "embedding", ttl_s=30.0, on_release=released)
    size = sum(nbytes_of(m) for m in metas_of(tensors))
    assert handle.handle_id and handle.owner_address == owner.owner_address
    assert handle.size_bytes == size and handle.lease_ttl_ms == 30_000
    assert sample("epd_leases_active", kind="embedding") == leases0 + 1
    if backend == "shm":
        assert handle.backend == common_pb2.TRANSFER_BACKEND_SHM
        assert handle.shm_segment_name.startswith(f"epd-{os.getpid()}-")
        assert handle.shm_segment_name in my_segments()
        assert os.stat(f"/dev/shm/{handle.shm_segment_name}").st_mode & 0o777 == 0o600
        assert sample("epd_shm_segments_active") == segs0 + 1
    else:
        assert handle.backend == BACKEND_ENUMS[backend] and handle.shm_segment_name == ""
    assert list(owner.metas(handle.handle_id)) == metas_of(tensors)

    got = receiver.fetch(handle, metas_of(tensors), "embedding")

    assert_bit_equal(got, tensors)
    got[0][1].add_(1.0)  # fetched tensors are fresh and writable, not views of the sender's
    assert not torch.equal(got[0][1], tensors[0][1])
    assert receiver.wait_for_acks()  # the fetch acks without waiting for the answer
    assert owner.lookup(handle.handle_id) is None and owner.metas(handle.handle_id) is None
    assert released.calls == 1
    assert sample("epd_leases_active", kind="embedding") == leases0
    assert sample("epd_shm_segments_active") == segs0
    assert handle.shm_segment_name not in my_segments() or backend == "grpc"
    assert sample("epd_transfer_bytes_total", kind="embedding", backend=backend) == bytes0 + size
    assert sample("epd_transfer_seconds_count", kind="embedding", backend=backend) == count0 + 1
    owner.close()
    assert released.calls == 1  # close after the ack frees nothing twice


def test_pull_chunks_follow_the_contract(make_owner):
    owner = make_owner("grpc")
    tensors = [("empty", torch.empty(0, 3)), ("big", torch.zeros(*BIG_SHAPE)), ("one", torch.tensor([7]))]
    handle = owner.publish(tensors, "kv", ttl_s=30.0)
    with grpc.insecure_channel(owner.owner_address) as channel:
        stub = transfer_pb2_grpc.TransferStub(channel)
        chunks = list(stub.Pull(transfer_pb2.PullRequest(handle_id=handle.handle_id, max_chunk_bytes=1), timeout=5))
    big_bytes = BIG_SHAPE[0] * BIG_SHAPE[1] * 4
    assert len(chunks) == 1 + big_bytes // 4096 + 1  # max_chunk_bytes=1 is clamped up to 4 KiB
    assert chunks[0].meta == meta_of("empty", tensors[0][1]) and chunks[0].data == b""
    assert chunks[1].meta.name == "big" and len(chunks[1].data) == 4096
    assert [c.offset_bytes for c in chunks[1:-1]] == list(range(0, big_bytes, 4096))
    assert not any(c.HasField("meta") for c in chunks[2:-1])
    assert chunks[-1].meta.name == "one" and chunks[-1].data == tensor_to_bytes(torch.tensor([7]))
    assert owner.lookup(handle.handle_id) is not None  # Pull alone is not an ack


@pytest.mark.parametrize("backend", BACKENDS)
def test_release_during_pull_does_not_cut_the_stream_short(make_owner, backend):
    owner = make_owner(backend)
    tensors = [("big", torch.randn(*BIG_SHAPE)), ("tail", torch.arange(5))]
    handle = owner.publish(tensors, "kv", ttl_s=30.0)
    request = transfer_pb2.PullRequest(handle_id=handle.handle_id, max_chunk_bytes=SMALL_CHUNK)
    with grpc.insecure_channel(owner.owner_address) as channel:
        stream = transfer_pb2_grpc.TransferStub(channel).Pull(request, timeout=5)
        first = next(stream)
        assert owner.release(handle.handle_id) is True
        rest = list(stream)
    assert first.meta.name == "big" and len(rest) == 13  # 12 more chunks of "big", 1 of "tail"
    data = first.data + b"".join(c.data for c in rest[:-1])
    assert data == tensor_to_bytes(tensors[0][1]) and rest[-1].data == tensor_to_bytes(tensors[1][1])
    assert my_segments() == set()


@pytest.mark.parametrize("backend", BACKENDS)
def test_publish_of_no_tensors_round_trips(make_owner, receiver, backend):
    owner = make_owner(backend)
    handle = owner.publish([], "embedding", ttl_s=30.0)
    assert handle.size_bytes == 0
    assert receiver.fetch(handle, [], "embedding") == []
    assert receiver.wait_for_acks()
    assert owner.lookup(handle.handle_id) is None


def test_chunk_size_rule():
    assert chunk_bytes(0) == 1 << 20 and chunk_bytes(-5) == 1 << 20
    assert chunk_bytes(1) == 4096 and chunk_bytes(10_000) == 10_000 and chunk_bytes(1 << 30) == 4 << 20


def test_shm_layout_aligns_every_tensor_to_64_bytes():
    assert shm_layout([4, 100, 0, 1, 64]) == [0, 64, 192, 192, 256]
    assert shm_segment_bytes([4, 100, 0, 1, 64]) == 320
    assert shm_segment_bytes([]) == 0 and shm_segment_bytes([0]) == 0
    with pytest.raises(ValueError):
        shm_layout([-1])


def test_shm_handle_is_pulled_over_grpc_when_the_segment_is_not_visible(make_owner, tmp_path):
    owner = make_owner("shm")
    tensors = payload()
    handle = owner.publish(tensors, "kv", ttl_s=30.0)
    bytes0 = sample("epd_transfer_bytes_total", kind="kv", backend="grpc")
    elsewhere = TransferReceiver(timeout_s=5.0, shm_dir=str(tmp_path))  # as if on another host
    try:
        got = elsewhere.fetch(handle, metas_of(tensors), "kv")
    finally:
        elsewhere.close()
    assert_bit_equal(got, tensors)
    assert sample("epd_transfer_bytes_total", kind="kv", backend="grpc") == bytes0 + handle.size_bytes
    assert handle.shm_segment_name not in my_segments()


def test_large_pulls_land_in_warm_buffers_that_a_kept_tensor_keeps_to_itself(make_owner, receiver):
    owner = make_owner("grpc")

    def pull(fill: int) -> torch.Tensor:
        tensors = [("kv", torch.full((5, 1 << 20), fill, dtype=torch.uint8))]  # 5 MiB: over the pool's minimum
        [(_, got)] = receiver.fetch(owner.publish(tensors, "kv", ttl_s=30.0), metas_of(tensors), "kv")
        return got

    kept = pull(1)
    other = pull(2)
    assert other.data_ptr() != kept.data_ptr()
    assert bool((kept == 1).all()) and bool((other == 2).all())
    kept_ptr = kept.data_ptr()
    del kept
    reused = pull(3)
    assert reused.data_ptr() == kept_ptr and bool((reused == 3).all()) and bool((other == 2).all())
    assert receiver.wait_for_acks()
