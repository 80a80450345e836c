"""Transfer layer end to end over a real loopback gRPC server, for the grpc and shm backends.

Bit-exact round trips for every awkward tensor (bf16, bool, 0-d, empty, multi-chunk), the lease
freed on every path (ack, TTL, close, refused publish) with gauges back to where they were, and
bounded, typed failures (NOT_FOUND, UNAVAILABLE, DATA_LOSS, INVALID_ARGUMENT).
"""

from __future__ import annotations

import glob
import os
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import torch
from prometheus_client import REGISTRY

from epd.transfer import (
    LeaseTableFull,
    TransferError,
    TransferReceiver,
    TransferSender,
    add_transfer_service,
    chunk_bytes,
    shm_layout,
    shm_segment_bytes,
)
from epd.v1 import common_pb2, transfer_pb2, transfer_pb2_grpc
from epd.wire.tensors import meta_of, nbytes_of, tensor_to_bytes

BACKENDS = ["grpc", "shm"]
BIG_SHAPE = (1024, 800)  # float32: 3,276,800 bytes > 3 MiB, i.e. 13 chunks of 256 KiB
SMALL_CHUNK = 256 << 10


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def my_segments() -> set[str]:
    return {os.path.basename(p) for p in glob.glob(f"/dev/shm/epd-{os.getpid()}-*")}


def payload() -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    return [
        ("f32", torch.randn(3, 5, generator=gen)),
        ("bf16", torch.randn(4, 7, generator=gen).to(torch.bfloat16)),
        ("i64", torch.arange(-5, 6, dtype=torch.int64) * (1 << 40)),
        ("mask", torch.randn(2, 9, generator=gen) > 0),
        ("scalar", torch.tensor(3.5)),
        ("empty", torch.empty(0, 8, dtype=torch.bfloat16)),
        ("fp8", (torch.randn(6, generator=gen) * 10).to(torch.float8_e4m3fn)),
        ("strided", torch.arange(12, dtype=torch.int32).reshape(3, 4).t()),  # [4, 3], not contiguous
        ("big", torch.randn(*BIG_SHAPE, generator=gen)),
    ]


def metas_of(tensors: list[tuple[str, torch.Tensor]]) -> list[common_pb2.TensorMeta]:
    return [meta_of(name, tensor) for name, tensor in tensors]


def assert_bit_equal(got: list[tuple[str, torch.Tensor]], want: list[tuple[str, torch.Tensor]]) -> None:
    assert [name for name, _ in got] == [name for name, _ in want]
    for (name, a), (_, b) in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert tensor_to_bytes(a) == tensor_to_bytes(b), name


class ReleaseCounter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


@pytest.fixture(autouse=True)
def no_leaked_segments() -> Iterator[None]:
    """Every test, whatever path it takes, must leave no segment of this process behind."""
    before = my_segments()
    yield
    assert my_segments() == before


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_owner(clock: FakeClock) -> Iterator[Callable[..., TransferSender]]:
    """Factory: a TransferSender served by a real gRPC server on 127.0.0.1; all stopped at teardown."""
    made: list[tuple[grpc.Server, TransferSender]] = []

    def make(backend: str, **kwargs) -> TransferSender:
        kwargs.setdefault("clock", clock)
        sender = TransferSender(backend, "", **kwargs)
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        add_transfer_service(server, sender)
        port = server.add_insecure_port("127.0.0.1:0")
        sender.owner_address = f"127.0.0.1:{port}"
        server.start()
        made.append((server, sender))
        return sender

    yield make
    for server, sender in made:
        server.stop(0)
        sender.close()


@pytest.fixture
def receiver() -> Iterator[TransferReceiver]:
    recv = TransferReceiver(timeout_s=5.0, max_chunk_bytes=SMALL_CHUNK)
    yield recv
    recv.close()


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
        assert handle.backend == common_pb2.TRANSFER_BACKEND_GRPC and handle.shm_segment_name == ""
    assert list(owner.metas(handle.handle_id)) == metas_of(tensors)

    got = receiver.fetch(handle, metas_of(tensors), "embedding")

    assert_bit_equal(got, tensors)
    got[0][1].add_(1.0)  # fetched tensors are fresh and writable, not views of the sender's
    assert not torch.equal(got[0][1], tensors[0][1])
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
    with pytest.raises(ValueError, match=r"'nccl' is not one of \('grpc', 'shm'\)"):
        TransferSender("nccl", "127.0.0.1:1")
    sender = TransferSender("grpc", "127.0.0.1:1")
    with pytest.raises(ValueError, match=r"'image' is not one of \('embedding', 'kv'\)"):
        sender.publish(payload()[:1], "image", 1.0)
    with pytest.raises(ValueError, match="max_chunk_bytes"):
        TransferReceiver(max_chunk_bytes=1)
    with pytest.raises(RuntimeError, match="owner_address"):
        TransferSender("grpc", "").publish(payload()[:1], "kv", 1.0)
    sender.close()
