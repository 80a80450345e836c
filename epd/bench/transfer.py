"""`epd bench transfer`: GB/s of each transfer backend beside the raw limit of its medium, in one run.

Each backend is measured through the project's own code: a child process publishes a payload with a
real `TransferSender` behind a real gRPC server on 127.0.0.1 (`epd.bench.transfer_peer`), and this
process fetches it with a real `TransferReceiver` (acking, so the child frees it). The limit beside
it moves the same bytes between the same two processes (or, for memcpy, within this one) with nothing
of ours in between:

    grpc      -> a plain loopback TCP socket (sendall / recv_into)
    shm       -> memcpy (a torch copy of the same size)
    nccl      -> raw torch.distributed send/recv on a 2-rank group (NCCL on GPUs, gloo on CPUs)
    cuda_ipc  -> a device-to-device copy on the GPU

Every figure is the median of `repeats` timed runs after one untimed warm-up.
"""

from __future__ import annotations

import select
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from epd.bench.transfer_peer import read_frame, write_frame

BACKENDS = ("grpc", "shm", "nccl", "cuda_ipc")
LIMITS = {"grpc": "loopback TCP socket", "shm": "memcpy", "nccl": "torch.distributed send/recv",
          "cuda_ipc": "device-to-device copy"}
_REPLY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class BackendFigures:
    backend: str
    gb_per_s: float  # median over the timed fetches
    limit_gb_per_s: float  # median of the raw medium, same bytes, same run
    via: str  # what actually carried it (gloo for nccl on a CPU machine)

    def to_dict(self) -> dict:
        return {"gb_per_s": round(self.gb_per_s, 3), "limit_gb_per_s": round(self.limit_gb_per_s, 3),
                "fraction_of_limit": round(self.gb_per_s / self.limit_gb_per_s, 3), "limit": LIMITS[self.backend],
                "via": self.via}


def parse_backends(text: str) -> list[str]:
    """`grpc,shm,nccl` -> the list; ValueError naming an unknown or repeated backend."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ValueError(f"--backend must name at least one of {BACKENDS}")
    for name in names:
        if name not in BACKENDS:
            raise ValueError(f"--backend {name!r} is not one of {BACKENDS}")
    if len(set(names)) != len(names):
        raise ValueError(f"--backend {text!r} names a backend twice")
    return names


def gb_per_s(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def median_rate(nbytes: int, timings: Sequence[float]) -> float:
    """GB/s of the median timing (so one slow outlier on a shared machine does not decide the figure)."""
    return gb_per_s(nbytes, statistics.median(timings))


def timed(run: Callable[[], object], repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls of `run`, after one untimed warm-up call."""
    run()
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        timings.append(time.perf_counter() - started)
    return timings


class Peer:
    """The child process that owns the payload (see epd.bench.transfer_peer); a context manager."""

    def __init__(self, backend: str, size_bytes: int) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "epd.bench.transfer_peer", backend, str(size_bytes)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)  # unbuffered: select() sees every frame
        word, self.address = self._reply().decode().split()
        if word != "ready":
            raise RuntimeError(f"transfer bench peer answered {word!r}")

    def command(self, text: str) -> None:
        write_frame(self._process.stdin, text.encode())

    def _reply(self) -> bytes:
        ready, _, _ = select.select([self._process.stdout], [], [], _REPLY_TIMEOUT_S)
        if not ready:
            raise TimeoutError(f"transfer bench peer sent nothing in {_REPLY_TIMEOUT_S:.0f} s")
        return read_frame(self._process.stdout)

    def publish(self):
        """A fresh handle on the payload and the payload's meta."""
        from epd.v1 import common_pb2

        self.command("publish")
        handle = common_pb2.TransferHandle.FromString(self._reply())
        return handle, common_pb2.TensorMeta.FromString(self._reply())

    @property
    def pid(self) -> int:
        return self._process.pid

    def wait_done(self) -> None:
        if self._reply() != b"done":
            raise RuntimeError("transfer bench peer did not finish its sends")

    def __enter__(self) -> Peer:
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.command("quit")
            self._process.stdin.close()
        except OSError:
            pass
        try:
            self._process.wait(10.0)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(5.0)
        self._process.stdout.close()


def fetch_timings(peer: Peer, repeats: int, receiver) -> list[float]:
    """Seconds per fetch of a freshly published handle (publishing is not timed)."""
    def one() -> float:
        handle, meta = peer.publish()
        started = time.perf_counter()
        receiver.fetch(handle, [meta], "kv")
        return time.perf_counter() - started

    one()  # warm-up: channel set-up, and for nccl the group's rendezvous
    timings = [one() for _ in range(repeats)]
    receiver.wait_for_acks()  # while the peer still runs to answer them
    return timings


def socket_timings(peer: Peer, size_bytes: int, repeats: int) -> list[float]:
    """The raw loopback TCP limit: the peer sendall()s the payload, this process recv_into()s it."""
    buffer = bytearray(size_bytes)
    view = memoryview(buffer)

    def one() -> float:
        with socket.create_server(("127.0.0.1", 0)) as server:
            started = time.perf_counter()
            peer.command(f"socket {server.getsockname()[1]}")
            conn, _ = server.accept()
            with conn:
                got = 0
                while got < size_bytes:
                    n = conn.recv_into(view[got:])
                    if n == 0:
                        raise ConnectionError(f"socket closed after {got} of {size_bytes} bytes")
                    got += n
            return time.perf_counter() - started

    one()
    return [one() for _ in range(repeats)]


def memcpy_timings(size_bytes: int, repeats: int) -> list[float]:
    import torch

    source = torch.ones(size_bytes, dtype=torch.uint8)  # [size_bytes]
    target = torch.empty_like(source)
    return timed(lambda: target.copy_(source), repeats)


def dist_timings(peer: Peer, size_bytes: int, repeats: int, device) -> tuple[list[float], str]:
    """Raw send/recv between the peer and this process on a fresh 2-rank group (nccl into a GPU, else gloo)."""
    import torch

    from epd.transfer.groups import OWNER_RANK, PULLER_RANK, make_group, master_store

    backend = "nccl" if device.type == "cuda" else "gloo"
    store = master_store("127.0.0.1", timeout_s=60.0)
    peer.command(f"dist {store.port} {repeats + 1}")
    group = make_group(backend, store, PULLER_RANK, timeout_s=60.0, device=device if backend == "nccl" else None)
    target = torch.empty(size_bytes, dtype=torch.uint8, device=device)
    timings = []
    for tag in range(repeats + 1):
        started = time.perf_counter()
        group.recv([target], OWNER_RANK, tag).wait()
        if backend == "nccl":
            torch.cuda.synchronize(device)
        timings.append(time.perf_counter() - started)
    peer.wait_done()
    return timings[1:], backend


def device_copy_timings(size_bytes: int, repeats: int) -> list[float]:
    import torch

    source = torch.ones(size_bytes, dtype=torch.uint8, device="cuda")
    target = torch.empty_like(source)

    def run() -> None:
        target.copy_(source)
        torch.cuda.synchronize()

    return timed(run, repeats)


def receiver_device(backend: str):
    """Where this process receives: the second GPU for nccl (the peer has the first), the first for cuda_ipc."""
    import torch

    count = torch.cuda.device_count()
    if backend == "nccl" and count >= 2:
        torch.cuda.set_device(1)
        return torch.device("cuda", 1)
    if backend == "cuda_ipc" and count:
        return torch.device("cuda", 0)
    return torch.device("cpu")


def measure(backend: str, size_bytes: int, repeats: int) -> BackendFigures:
    """One backend's figures (its own child process), the limit measured right after it."""
    from epd.transfer import TransferReceiver

    if backend == "cuda_ipc":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--backend cuda_ipc needs a CUDA device, and this machine has none")
    device = receiver_device(backend)
    receiver = TransferReceiver(timeout_s=120.0, device=device)
    try:
        with Peer(backend, size_bytes) as peer:
            rate = median_rate(size_bytes, fetch_timings(peer, repeats, receiver))
            via = backend
            if backend == "grpc":
                limit = socket_timings(peer, size_bytes, repeats)
            elif backend == "shm":
                limit = memcpy_timings(size_bytes, repeats)
            elif backend == "nccl":
                limit, via = dist_timings(peer, size_bytes, repeats, device)
                via = receiver.group_backend(peer.address) or via
            else:
                limit = device_copy_timings(size_bytes, repeats)
    finally:
        receiver.close()
    return BackendFigures(backend, rate, median_rate(size_bytes, limit), via)


def run_transfer_bench(backends: Sequence[str], size_mb: float, repeats: int) -> dict[str, BackendFigures]:
    if not size_mb > 0 or repeats < 1:
        raise ValueError("--size-mb must be > 0 and --repeats >= 1")
    from epd.malloc import keep_freed_memory_warm

    keep_freed_memory_warm()  # as a worker does at start: this process is the receiving worker here
    size_bytes = int(size_mb * (1 << 20))
    return {backend: measure(backend, size_bytes, repeats) for backend in backends}


def format_transfer(figures: dict[str, BackendFigures], size_mb: float) -> str:
    lines = [f"transfer of {size_mb:g} MiB (median GB/s)",
             f"{'backend':<10}{'GB/s':>8}  {'limit GB/s':>10}  {'of limit':>8}  limit"]
    for name, f in figures.items():
        lines.append(f"{name:<10}{f.gb_per_s:>8.2f}  {f.limit_gb_per_s:>10.2f}  "
                     f"{f.gb_per_s / f.limit_gb_per_s:>8.0%}  {LIMITS[name]} ({f.via})")
    return "\n".join(lines)
