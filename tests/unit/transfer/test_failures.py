"""Transfer failure paths: the lease freed on every path (TTL, reaper, close, refused publish) with the
gauges back where they were, and bounded, typed errors (NOT_FOUND, UNAVAILABLE, DATA_LOSS, INVALID_ARGUMENT)."""

from __future__ import annotations

import os
import socket
import time

import grpc
import pytest
import torch

from epd.transfer import (
    LeaseTableFull,
    TransferError,
    TransferReceiver,
    TransferSender,
)
from epd.v1 import common_pb2
from epd.wire.tensors import meta_of, nbytes_of
from tests.unit.transfer.helpers import (
    BACKENDS,
    ReleaseCounter,
    metas_of,
    my_segments,
    payload,
    sample,
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ttl_reap_frees_and_fetch_is_not_found(make_owner, receiver, clock, backend):
    owner = make_owner(backend)
    released = ReleaseCounter()
    leases0, reaped0 = sample("epd_leases_active", kind="kv"), sample("epd_reaped_total", kind="kv")
    tensors = payload()[:3]
    handle = owner.publish(tensors, "kv", ttl_s=5.0, on_release=released)
    clock.now += 4.9
    assert owner.reap() == 0
    clock.now += 0.1
    assert owner.reap() == 1
    assert released.calls == 1
    assert sample("epd_leases_active", kind="kv") == leases0
    assert sample("epd_reaped_total", kind="kv") == reaped0 + 1
    assert my_segments() == set()
    with pytest.raises(TransferError) as info:
        receiver.fetch(handle, metas_of(tensors), "kv")
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    assert handle.handle_id in str(info.value) and owner.owner_address in str(info.value)
    assert released.calls == 1


def test_expired_lease_is_not_served_even_before_the_reaper_runs(make_owner, receiver, clock):
    owner = make_owner("grpc")
    released = ReleaseCounter()
    reaped0 = sample("epd_reaped_total", kind="embedding")
    tensors = payload()[:2]
    handle = owner.publish(tensors, "embedding", ttl_s=1.0, on_release=released)
    clock.now += 1.0
    with pytest.raises(TransferError) as info:
        receiver.fetch(handle, metas_of(tensors), "embedding")
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    assert released.calls == 1 and sample("epd_reaped_total", kind="embedding") == reaped0 + 1


def test_reaper_thread_frees_expired_leases(make_owner):
    owner = make_owner("shm", clock=time.monotonic)
    released = ReleaseCounter()
    handle = owner.publish(payload()[:2], "kv", ttl_s=0.05, on_release=released)
    owner.start_reaper(interval_s=0.02)
    deadline = time.monotonic() + 5.0
    while released.calls == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert released.calls == 1
    assert handle.shm_segment_name not in my_segments()
    with pytest.raises(RuntimeError):
        owner.start_reaper()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("backend", [common_pb2.TRANSFER_BACKEND_GRPC, common_pb2.TRANSFER_BACKEND_SHM])
def test_unreachable_owner_fails_within_the_timeout(receiver, backend):
    tensors = payload()[:2]
    handle = common_pb2.TransferHandle(
        backend=backend, handle_id="ab" * 16, owner_address=f"127.0.0.1:{_free_port()}",
        size_bytes=sum(nbytes_of(m) for m in metas_of(tensors)), lease_ttl_ms=1000,
        shm_segment_name=f"epd-{os.getpid()}-{'0' * 16}",  # no such segment: falls back to Pull
    )
    bytes0 = sample("epd_transfer_bytes_total", kind="kv", backend="grpc")
    started = time.monotonic()
    with pytest.raises(TransferError) as info:
        receiver.fetch(handle, metas_of(tensors), "kv", timeout_s=1.0)
    assert time.monotonic() - started < 5.0
    assert info.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert handle.owner_address in str(info.value) and handle.handle_id in str(info.value)
    assert sample("epd_transfer_bytes_total", kind="kv", backend="grpc") == bytes0
    assert receiver.release(handle) is False  # a lost ack is reported, never raised


@pytest.mark.parametrize("backend", BACKENDS)
def test_metas_that_disagree_with_the_handle_are_invalid_argument(make_owner, receiver, backend):
    owner = make_owner(backend)
    tensors = payload()[:3]
    handle = owner.publish(tensors, "kv", ttl_s=30.0)
    wrong = metas_of(tensors)[:2]
    with pytest.raises(TransferError) as info:
        receiver.fetch(handle, wrong, "kv")
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "adds up to" in str(info.value)
    assert owner.lookup(handle.handle_id) is not None  # rejected before touching the owner


def test_stream_meta_mismatch_is_data_loss_and_releases(make_owner, receiver):
    owner = make_owner("grpc")
    tensors = [("a", torch.zeros(2, 6)), ("b", torch.ones(3))]
    handle = owner.publish(tensors, "kv", ttl_s=30.0)
    reshaped = [meta_of("a", torch.zeros(3, 4)), meta_of("b", torch.ones(3))]  # same bytes, other shape
    with pytest.raises(TransferError) as info:
        receiver.fetch(handle, reshaped, "kv")
    assert info.value.code == grpc.StatusCode.DATA_LOSS
    assert "expected 'a' DTYPE_FLOAT32 [3, 4]" in str(info.value)
    assert owner.lookup(handle.handle_id) is None  # retrying cannot help: the receiver acked


def test_shm_layout_mismatch_is_data_loss(make_owner, receiver):
    owner = make_owner("shm")
    tensors = [("small", torch.zeros(1)), ("large", torch.ones(25))]  # 4 + 100 bytes: segment of 164
    handle = owner.publish(tensors, "kv", ttl_s=30.0)
    swapped = [meta_of("small", torch.zeros(25)), meta_of("large", torch.ones(1))]  # same total, needs 132
    with pytest.raises(TransferError) as info:
        receiver.fetch(handle, swapped, "kv")
    assert info.value.code == grpc.StatusCode.DATA_LOSS and "164 bytes" in str(info.value)
    assert my_segments() == set()


def test_shm_segment_name_must_not_be_a_path(receiver):
    handle = common_pb2.TransferHandle(backend=common_pb2.TRANSFER_BACKEND_SHM, handle_id="x",
                                       owner_address="127.0.0.1:1", shm_segment_name="../etc/passwd")
    with pytest.raises(TransferError) as info:
        receiver.fetch(handle, [], "kv")
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and "epd-<pid>-<hex>" in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_release_without_fetch(make_owner, receiver, backend):
    owner = make_owner(backend)
    released = ReleaseCounter()
    tensors = payload()[:2]
    handle = owner.publish(tensors, "embedding", ttl_s=30.0, on_release=released)
    assert receiver.release(handle) is True
    assert receiver.release(handle) is False
    assert released.calls == 1 and my_segments() == set()
    with pytest.raises(TransferError) as info:
        receiver.fetch(handle, metas_of(tensors), "embedding")
    assert info.value.code == grpc.StatusCode.NOT_FOUND


def test_sender_close_unlinks_every_segment(make_owner):
    owner = make_owner("shm")
    released = ReleaseCounter()
    segs0 = sample("epd_shm_segments_active")
    leases0 = sample("epd_leases_active", kind="embedding") + sample("epd_leases_active", kind="kv")
    handles = [owner.publish(payload()[:2], kind, 30.0, on_release=released) for kind in ("kv", "embedding", "kv")]
    assert my_segments() == {h.shm_segment_name for h in handles}
    assert sample("epd_shm_segments_active") == segs0 + 3
    owner.close()
    assert my_segments() == set() and released.calls == 3
    assert sample("epd_shm_segments_active") == segs0
    assert sample("epd_leases_active", kind="embedding") + sample("epd_leases_active", kind="kv") == leases0
    with pytest.raises(RuntimeError, match="closed"):
        owner.publish(payload()[:1], "kv", 30.0)


def test_refused_publish_leaks_nothing(make_owner):
    owner = make_owner("shm", max_leases=1)
    released = ReleaseCounter()
    owner.publish(payload()[:1], "kv", 30.0)
    segs, leases = sample("epd_shm_segments_active"), sample("epd_leases_active", kind="kv")
    with pytest.raises(LeaseTableFull):
        owner.publish(payload()[:1], "kv", 30.0, on_release=released)
    assert len(my_segments()) == 1 and released.calls == 0
    assert sample("epd_shm_segments_active") == segs and sample("epd_leases_active", kind="kv") == leases
    owner.publish(payload()[:1], "embedding", 30.0)  # the limit is per kind
    assert len(my_segments()) == 2


def test_bad_configuration_names_the_value():
    with pytest.raises(ValueError, match=r"'rdma' is not one of \('grpc', 'shm', 'nccl', 'cuda_ipc'\)"):
        TransferSender("rdma", "127.0.0.1:1")
    sender = TransferSender("grpc", "127.0.0.1:1")
    with pytest.raises(ValueError, match=r"'image' is not one of \('embedding', 'kv'\)"):
        sender.publish(payload()[:1], "image", 1.0)
    with pytest.raises(ValueError, match="max_chunk_bytes"):
        TransferReceiver(max_chunk_bytes=1)
    with pytest.raises(RuntimeError, match="owner_address"):
        TransferSender("grpc", "").publish(payload()[:1], "kv", 1.0)
    sender.close()
