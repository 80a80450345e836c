"""What `epd ray up` places where: pure decisions, no Ray, testable on exact values.

Every worker is a Ray actor holding the role's resources (CPUs, and GPUs where the cluster has
them); the actor runs the worker as its child process, the same `epd ROLE` a user runs by hand.
The router learns the actors' addresses through the controller actor (a workers file it re-reads,
see router/discovery.py), so scaling a role is: start actors and add them, or drop them from the
file, wait until the router has drained them, then stop them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from epd.engine_args import passed_to

WORKER_ROLES = ("encoder", "prefill", "decode")
NODE_IP = "node-ip"  # --worker-host value: each worker binds (and advertises) its own node's IP


@dataclass(frozen=True)
class RayClusterSpec:
    """Everything `epd ray up` was asked for (also what the Python API takes)."""

    model_dir: str
    encoders: int = 1
    prefills: int = 1
    decodes: int = 1
    host: str = "127.0.0.1"  # where the router's HTTP port listens (on the driver's node)
    port: int = 8000
    grpc_port: int = 0
    worker_host: str = "127.0.0.1"  # what workers bind and advertise; NODE_IP: each its node's IP
    cpus_per_worker: float = 1.0
    gpus_per_worker: float | None = None  # None: 1 where the cluster has GPUs, else 0
    transfer: str = "grpc"
    dtype: str = "auto"
    worker_args: tuple[str, ...] = ()  # engine flags for prefill / decode workers (--kernels to encoders too)
    allow_url_hosts: tuple[str, ...] = ()
    otlp_endpoint: str | None = None
    log_level: str = "WARNING"
    start_timeout_s: float = 300.0
    drain_timeout_s: float = 120.0  # a scaled-down worker is stopped after this even if still busy
    name: str = "epd"  # the controller's Ray actor name: `epd ray scale` finds the cluster by it

    def __post_init__(self) -> None:
        for role in WORKER_ROLES:
            check_count(role, self.count(role))
        if self.cpus_per_worker < 0 or (self.gpus_per_worker is not None and self.gpus_per_worker < 0):
            raise ValueError("--cpus-per-worker and --gpus-per-worker must be >= 0")
        if self.transfer not in ("grpc", "shm"):
            raise ValueError(f"--transfer must be grpc or shm, got {self.transfer!r}")
        if self.worker_host in ("0.0.0.0", "::", ""):
            raise ValueError("--worker-host must be an address peers can reach (a worker advertises it in the "
                             f"transfer handles they pull from), not {self.worker_host!r}; use {NODE_IP} for "
                             "each worker's node IP")
        if self.transfer == "shm" and self.worker_host not in ("127.0.0.1", "localhost"):
            raise ValueError("--transfer shm needs every worker on one host (--worker-host 127.0.0.1)")

    def count(self, role: str) -> int:
        return {"encoder": self.encoders, "prefill": self.prefills, "decode": self.decodes}[role]

    def gpus(self, cluster_gpus: float) -> float:
        """GPUs each worker actor asks Ray for."""
        if self.gpus_per_worker is not None:
            return self.gpus_per_worker
        return 1.0 if cluster_gpus >= 1 else 0.0

    def worker_command(self, role: str, ready_file: str) -> list[str]:
        """`epd ROLE ...` arguments for one worker (port 0: it reports its port in the ready file)."""
        host = "{node_ip}" if self.worker_host == NODE_IP else self.worker_host  # filled in on the node
        args = [role, "--model", self.model_dir, "--host", host, "--port", "0",
                "--metrics-port", "0", "--ready-file", ready_file, "--log-level", self.log_level,
                "--dtype", self.dtype]
        if role != "decode":
            args += ["--transfer", self.transfer]
        args += list(passed_to(role, self.worker_args))
        if self.otlp_endpoint:
            args += ["--otlp-endpoint", self.otlp_endpoint]
        return args

    def router_command(self, workers_file: str, ready_file: str) -> list[str]:
        args = ["router", "--model", self.model_dir, "--host", self.host, "--port", str(self.port),
                "--grpc-port", str(self.grpc_port), "--workers-file", workers_file, "--ready-file", ready_file,
                "--log-level", self.log_level]
        for host in self.allow_url_hosts:
            args += ["--allow-url-host", host]
        if self.otlp_endpoint:
            args += ["--otlp-endpoint", self.otlp_endpoint]
        return args


def check_count(role: str, n: int) -> None:
    if role not in WORKER_ROLES:
        raise ValueError(f"unknown role {role!r}: one of {', '.join(WORKER_ROLES)}")
    if not 1 <= n <= 64:
        raise ValueError(f"{role} replicas must be between 1 and 64, got {n}")


@dataclass(frozen=True)
class Member:
    """A worker the router should route to: what its ready file said, as the router needs it."""

    name: str  # e.g. decode-3 (numbers are never reused, so a name is one actor's for life)
    role: str
    address: str
    metrics_url: str


@dataclass
class ScalePlan:
    start: int = 0  # how many new workers of the role to start
    drain: list[str] = field(default_factory=list)  # names to take out of routing, then stop


def plan_scale(current: list[str], wanted: int) -> ScalePlan:
    """`current`: the role's worker names, oldest first. Scaling down drains the newest first: the
    oldest have the warmest caches (prefix KV, embeddings)."""
    if wanted >= len(current):
        return ScalePlan(start=wanted - len(current))
    return ScalePlan(drain=list(reversed(current[wanted:])))


def workers_file_text(members: list[Member]) -> str:
    """The router's `--workers-file` contents (router/discovery.py FileDiscovery)."""
    ordered = sorted(members, key=lambda m: (m.role, m.name))
    return json.dumps({"workers": [{"role": m.role, "address": m.address, "metrics_url": m.metrics_url,
                                    "name": m.name} for m in ordered]}, indent=1)


def advertised_host(worker_host: str, node_ip: str) -> str:
    """The address the router reaches a worker at: its node's IP under --worker-host node-ip."""
    return node_ip if worker_host == NODE_IP else worker_host


def member_from_ready(name: str, info: dict, node_ip: str, worker_host: str) -> Member:
    """A worker's ready file ({role, address, metrics_port}) as a routing member."""
    host = advertised_host(worker_host, node_ip)
    port = str(info["address"]).rsplit(":", 1)[1]
    bracketed = f"[{host}]" if ":" in host else host
    return Member(name, str(info["role"]), f"{bracketed}:{port}",
                  f"http://{bracketed}:{int(info['metrics_port'])}/metrics")
