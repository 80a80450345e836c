"""What every worker process does around its servicers: bind, warm up, turn ready, stop cleanly.

Order matters for the seed failure: the caller loads its model *before* `serve_worker`, so a
worker without what it needs exits before it ever binds a port; health turns SERVING and the
ready file appears only after a real warm-up pass has succeeded.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from epd import tls, tracing
from epd.files import write_atomically
from epd.heap import freeze_startup_heap
from epd.malloc import keep_freed_memory_warm
from epd.metrics import serve_metrics
from epd.rpc_errors import ErrorMappingInterceptor
from epd.threads import single_threaded

log = logging.getLogger(__name__)

# Large enough for a prefill's KV handle description, bounded so a bad peer can't make us buffer GBs.
MAX_MESSAGE_BYTES = 256 << 20
GRPC_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]


@dataclass(frozen=True)
class WorkerOptions:
    """Where a worker listens and how much it takes on at once."""

    host: str = "127.0.0.1"
    port: int = 0  # 0: pick a free port; the ready file says which
    metrics_port: int = 0
    ready_file: str | None = None
    threads: int = 64  # gRPC handler threads
    max_concurrent_rpcs: int = 128  # beyond this, callers get RESOURCE_EXHAUSTED at once
    otlp_endpoint: str | None = None  # HOST:PORT of an OTLP/gRPC trace collector; None: no tracing

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536 or not 0 <= self.metrics_port < 65536:
            raise ValueError(f"ports must be in [0, 65535], got {self.port} and {self.metrics_port}")
        if self.threads < 2 or self.max_concurrent_rpcs < 1:
            raise ValueError(f"threads must be >= 2 and max_concurrent_rpcs >= 1, got {self.threads}, "
                             f"{self.max_concurrent_rpcs}")


@dataclass(frozen=True)
class BoundWorker:
    """A started worker: its address is known only after binding."""

    role: str
    address: str
    metrics_port: int
    server: grpc.Server
    health: health.HealthServicer
    services: tuple[str, ...]  # full names of the role's gRPC services, for health


def start_worker(role: str, options: WorkerOptions, add_services: Callable[[grpc.Server, str], list[str]]
                 ) -> BoundWorker:
    """Bind the gRPC server (health NOT_SERVING), start it and the metrics endpoint.

    add_services(server, address) registers the role's servicers and returns their full service names.
    """
    keep_freed_memory_warm()  # requests' buffers reuse warm memory (epd.malloc)
    # Handler threads only move bytes: no OpenMP team of their own (see epd.threads).
    pool = ThreadPoolExecutor(options.threads, thread_name_prefix=f"epd-{role}", initializer=single_threaded)
    interceptors = [ErrorMappingInterceptor(role)]
    if tracing.setup(role, options.otlp_endpoint):
        interceptors.insert(0, tracing.ServerTracing())  # outermost: the span covers the error mapping
    server = grpc.server(pool,
                         interceptors=interceptors, options=GRPC_OPTIONS,
                         maximum_concurrent_rpcs=options.max_concurrent_rpcs)
    port = tls.add_port(server, f"{options.host}:{options.port}")  # mutual TLS when configured (epd.tls)
    if port == 0:
        raise OSError(f"cannot bind {options.host}:{options.port} for the {role} gRPC server")
    address = f"{options.host}:{port}"
    checker = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    names = add_services(server, address)
    for name in ["", *names]:
        checker.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    server.start()
    metrics_port = serve_metrics(options.host, options.metrics_port)
    return BoundWorker(role, address, metrics_port, server, checker, tuple(names))


def write_ready_file(path: str | None, info: dict) -> None:
    """`info` plus this pid as JSON, written atomically (launchers poll for the file to appear whole)."""
    if not path:
        return
    write_atomically(path, json.dumps({**info, "pid": os.getpid()}))


def mark_ready(worker: BoundWorker, ready_file: str | None) -> None:
    """Health SERVING everywhere, then the ready file (written atomically) for launchers."""
    for name in ["", *worker.services]:
        worker.health.set(name, health_pb2.HealthCheckResponse.SERVING)
    write_ready_file(ready_file, {"role": worker.role, "address": worker.address,
                                  "metrics_port": worker.metrics_port})
    log.info("%s ready at %s (metrics on port %d)", worker.role, worker.address, worker.metrics_port)
    print(f"epd {worker.role}: ready at {worker.address}, metrics at "
          f"http://{worker.address.rsplit(':', 1)[0]}:{worker.metrics_port}/metrics", flush=True)


def wait_for_shutdown(worker: BoundWorker, grace_s: float = 3.0) -> None:
    """Block until SIGTERM / SIGINT, then stop taking calls and let running ones finish (bounded)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    worker.health.enter_graceful_shutdown()
    worker.server.stop(grace_s).wait(grace_s + 1.0)
    log.info("%s stopped", worker.role)


def run_worker(role: str, options: WorkerOptions, add_services: Callable[[grpc.Server, str], list[str]],
               warm_up: Callable[[], None], closers: list[Callable[[], None]]) -> int:
    """A worker's whole life: bind (not serving), warm up, turn ready, serve until a signal, then close
    what it holds (`closers`, in order) on every path. Returns the process exit code."""
    worker = start_worker(role, options, add_services)
    # What loading made lives as long as the process (epd.heap); frozen before the warm-up, whose
    # compiles ask for collections that would otherwise walk all of it.
    freeze_startup_heap()
    try:
        try:
            warm_up()
        except Exception as exc:  # a worker whose warm-up fails must never look ready
            log.exception("%s warm-up failed", role)
            print(f"epd {role}: warm-up failed, not serving: {exc}", file=sys.stderr)
            return 1
        mark_ready(worker, options.ready_file)
        wait_for_shutdown(worker)
        return 0
    finally:
        worker.server.stop(0)
        for close in closers:
            close()
        tracing.shutdown()


def add_transfer(server: grpc.Server, address: str, sender) -> str:
    """Serve `sender`'s leases on this worker's gRPC server; returns the service name for health."""
    from epd.transfer.servicer import add_transfer_service
    from epd.v1 import transfer_pb2

    sender.owner_address = address
    add_transfer_service(server, sender)
    return transfer_pb2.DESCRIPTOR.services_by_name["Transfer"].full_name
