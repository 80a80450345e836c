"""The owner side: publish tensors behind a leased handle, free them on ack, TTL or shutdown.

One `LeaseTable` per kind, so `epd_reaped_total{kind}` can be counted from the table's hook and a
flood of one kind cannot use up the other kind's leases (`max_leases` applies per kind).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence

import torch

from epd.metrics import LEASES_ACTIVE, REAPED, SHM_SEGMENTS_ACTIVE
from epd.transfer.labels import BACKENDS, KINDS, check_backend, check_kind
from epd.transfer.layout import shm_layout, shm_segment_bytes
from epd.transfer.leases import LeaseTable
from epd.transfer.payload import Lease, MemorySource, ShmSource
from epd.transfer.shm import byte_view, device_byte_view, new_segment_name, segment_path, write_segment
from epd.v1 import common_pb2
from epd.wire.tensors import meta_of, nbytes_of

logger = logging.getLogger(__name__)

_REAPER_JOIN_S = 5.0


class TransferSender:
    """Holds published tensors for receivers to Pull (grpc) or copy from a segment (shm).

    Thread-safe. `owner_address` may be assigned after construction (the port is known only once the
    gRPC server has bound); it is read at each `publish`. Published tensors must not be modified in
    place until their lease ends: the grpc backend serves them without a copy when they are already
    contiguous CPU tensors (`on_release` tells the publisher when it may reuse them).
    """

    def __init__(
        self,
        backend: str,
        owner_address: str,
        *,
        max_leases: int = 4096,
        max_lease_bytes: int | None = 16 << 30,
        shm_dir: str = "/dev/shm",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = check_backend(backend)
        if backend == "shm" and not os.path.isdir(shm_dir):
            raise ValueError(f"shm_dir {shm_dir!r} is not a directory (the shm backend needs a tmpfs such as /dev/shm)")
        self.owner_address = owner_address
        self.shm_dir = shm_dir
        self._tables = {
            kind: LeaseTable(max_entries=max_leases, max_bytes=max_lease_bytes, clock=clock,
                             on_reaped=REAPED.labels(kind=kind).inc)
            for kind in KINDS
        }
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        self._closed = False
        self._pairs = None  # OwnerPairs, made at the first rendezvous (the host is known by then)
        self._pairs_lock = threading.Lock()
        self.group_timeout_s = 30.0
        if backend == "cuda_ipc" and not torch.cuda.is_available():
            raise ValueError("transfer backend cuda_ipc needs a CUDA device, and this process sees none")
        if backend == "nccl":
            from epd.transfer.groups import local_backends

            if "nccl" not in local_backends():
                logger.warning("nccl: no CUDA, using gloo (transfers stay in CPU memory)")

    def publish(
        self,
        tensors: Sequence[tuple[str, torch.Tensor]],
        kind: str,
        ttl_s: float,
        on_release: Callable[[], None] | None = None,
    ) -> common_pb2.TransferHandle:
        """Lease `tensors` (in order) for `ttl_s` seconds and return the handle a receiver fetches.

        Raises ValueError for an unknown kind, a dtype with no wire type or a bad ttl,
        LeaseTableFull when `max_leases` of this kind are active or they would hold more than
        `max_lease_bytes`, RuntimeError after `close`.
        If it raises, nothing is held and `on_release` is not called.
        """
        table = self._tables[check_kind(kind)]
        if self._closed:
            raise RuntimeError("transfer sender is closed")
        if not self.owner_address:
            raise RuntimeError("transfer sender has no owner_address yet (set it once the gRPC server has bound)")
        metas = [meta_of(name, tensor) for name, tensor in tensors]
        nbytes = [nbytes_of(meta) for meta in metas]
        source, segment_name = self._store([tensor for _, tensor in tensors], nbytes)
        lease = Lease(kind=kind, metas=metas, nbytes=nbytes, source=source, on_release=on_release)
        # Count before issuing: a reaper may free the lease the instant it is in the table.
        LEASES_ACTIVE.labels(kind=kind).inc()
        try:
            handle_id = table.issue(lease, ttl_s, on_free=self._free, nbytes=sum(nbytes))
        except BaseException:
            LEASES_ACTIVE.labels(kind=kind).dec()
            self._free_source(source)
            raise
        return common_pb2.TransferHandle(
            backend=BACKENDS[self.backend],
            handle_id=handle_id,
            owner_address=self.owner_address,
            size_bytes=sum(nbytes),
            lease_ttl_ms=round(ttl_s * 1000),
            shm_segment_name=segment_name,
        )

    def lookup(self, handle_id: str) -> Lease | None:
        """The live lease behind `handle_id`, or None when unknown or expired (for the servicer)."""
        for table in self._tables.values():
            lease = table.get(handle_id)
            if lease is not None:
                return lease  # type: ignore[return-value]
        return None

    def metas(self, handle_id: str) -> list[common_pb2.TensorMeta] | None:
        """Metadata of a live handle's tensors in payload order; None when unknown or expired."""
        lease = self.lookup(handle_id)
        return None if lease is None else list(lease.metas)

    def pairs(self):
        """The groups this owner sends over (nccl backend), made on first use on the owner's own host."""
        with self._pairs_lock:
            if self._pairs is None:
                from epd.transfer.pairs import OwnerPairs

                self._pairs = OwnerPairs(self.owner_address.rsplit(":", 1)[0].strip("[]"), self.group_timeout_s)
            return self._pairs

    def release(self, handle_id: str) -> bool:
        """Free a handle now (the receiver's ack); False when unknown or already expired."""
        return any(table.release(handle_id) for table in self._tables.values())

    def reap(self) -> int:
        """Free every expired lease now; returns how many."""
        return sum(table.reap() for table in self._tables.values())

    def start_reaper(self, interval_s: float = 1.0) -> None:
        """Reap expired leases every `interval_s` seconds on a daemon thread until `close`."""
        if not interval_s > 0:
            raise ValueError(f"reaper interval_s must be > 0, got {interval_s}")
        if self._reaper is not None or self._closed:
            raise RuntimeError("reaper already started or sender closed")
        self._reaper = threading.Thread(target=self._reap_loop, args=(interval_s,), name="epd-lease-reaper",
                                        daemon=True)
        self._reaper.start()

    def close(self) -> None:
        """Stop the reaper, free every lease (calling each `on_release`) and unlink every segment. Idempotent."""
        self._closed = True
        self._stop.set()
        if self._reaper is not None:
            self._reaper.join(timeout=_REAPER_JOIN_S)
        for table in self._tables.values():
            table.close()
        with self._pairs_lock:
            if self._pairs is not None:
                self._pairs.close()

    def _store(self, tensors: list[torch.Tensor], nbytes: list[int]) -> tuple[MemorySource | ShmSource, str]:
        if self.backend == "grpc":
            return MemorySource([byte_view(tensor) for tensor in tensors]), ""
        if self.backend in ("nccl", "cuda_ipc"):  # kept where they are (device memory on GPUs): sent from there
            views = [device_byte_view(tensor) for tensor in tensors]
            if self.backend == "cuda_ipc" and not all(view.is_cuda for view in views):
                raise ValueError("cuda_ipc publishes GPU tensors only (this worker's tensors are on the CPU)")
            if any(view.is_cuda for view in views):
                torch.cuda.synchronize()  # the kernels that wrote them must be done before another stream sends
            return MemorySource(views), ""
        name = new_segment_name()
        path = segment_path(self.shm_dir, name)
        offsets = shm_layout(nbytes)
        write_segment(path, offsets, shm_segment_bytes(nbytes), tensors)
        SHM_SEGMENTS_ACTIVE.inc()
        return ShmSource(path, offsets), name

    def _free(self, payload: object) -> None:
        # Called exactly once per issued lease by the LeaseTable, outside its lock.
        assert isinstance(payload, Lease)
        LEASES_ACTIVE.labels(kind=payload.kind).dec()
        self._free_source(payload.source)
        if payload.on_release is not None:
            payload.on_release()

    @staticmethod
    def _free_source(source: MemorySource | ShmSource) -> None:
        if isinstance(source, ShmSource):
            if not source.free():
                logger.warning("shared-memory segment %s was already gone when its lease ended", source.path)
            SHM_SEGMENTS_ACTIVE.dec()  # the gauge counts segments we created, removed by us or not
        else:
            source.free()

    def _reap_loop(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.reap()
            except Exception:  # a failing reap must not kill the thread and stop all future reaping
                logger.exception("lease reaper failed; retrying in %.1f s", interval_s)
