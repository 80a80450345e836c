"""`epd serve`: the whole cluster on one machine, each role its own OS process on loopback.

Every process starts at once, each worker with port 0 and a ready file (so no port is guessed and
raced). The router, whose imports (torch through transformers) take ~4 CPU-s, loads meanwhile and
learns the workers' addresses from a workers file (router/discovery.py) that is written once every
worker has written its ready file; the URL is printed only when the router's /ready says every
role has a ready worker. Children get PR_SET_PDEATHSIG, so even a
SIGKILLed launcher leaves no orphan; SIGTERM / Ctrl-C stop them in order and wait, bounded.

Once serving, a worker that dies is restarted (epd.supervision says when, and when to give up) on
the address it had, so the router's health checks see the same worker return to ready; the rest
keep serving meanwhile. The restarts are written to a file the router shows in /workers.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from epd.cpu_affinity import plan_affinity
from epd.devices import assign_gpus, check_device, parse_gpus, visible_gpus
from epd.engine_args import passed_to
from epd.files import write_atomically
from epd.supervision import RestartPolicy, RestartState
from epd.transfer_backends import check_transfer


@dataclass(frozen=True)
class ServeOptions:
    model_dir: str
    host: str = "127.0.0.1"
    port: int = 8000
    grpc_port: int = 0
    encoders: int = 1
    prefills: int = 1
    decodes: int = 1
    transfer: str = "grpc"
    allow_url_hosts: tuple[str, ...] = ()
    start_timeout_s: float = 300.0
    log_level: str = "WARNING"
    colocated: bool = False  # one worker doing encode, prefill and decode on one engine
    cpu_affinity: str | None = None  # "auto" or "ROLE=CPUS,..." (see epd.cpu_affinity)
    engine_args: tuple[str, ...] = ()  # passed to every worker that runs the engine (--kernels to encoders too)
    dtype: str = "auto"
    device: str = "auto"  # every worker's --device
    gpus: str | None = None  # "auto" or "0,1,…": CUDA_VISIBLE_DEVICES per worker (epd.devices.assign_gpus)
    otlp_endpoint: str | None = None  # every process exports its traces here
    restart: RestartPolicy = RestartPolicy()

    def __post_init__(self) -> None:
        for name in ("encoders", "prefills", "decodes"):
            if not 1 <= getattr(self, name) <= 64:
                raise ValueError(f"--{name} must be between 1 and 64, got {getattr(self, name)}")
        check_transfer(self.transfer)
        check_device(self.device)
        if self.gpus is not None:
            parse_gpus(self.gpus, visible=0)  # fails early on a bad spec
        if self.cpu_affinity is not None:
            plan_affinity(self.cpu_affinity, self.processes(), available_cpus())  # fails early on a bad spec

    def processes(self) -> list[tuple[str, str]]:
        """(name, role) of every process to start, workers first, in start order."""
        counts = (("colocated", 1),) if self.colocated else (
            ("encoder", self.encoders), ("prefill", self.prefills), ("decode", self.decodes))
        return [(f"{role}-{i}", role) for role, n in counts for i in range(n)] + [("router", "router")]


def available_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


PER_PROCESS_VARIABLES = ("EPD_PORT", "EPD_METRICS_PORT", "EPD_GRPC_PORT")


def child_environment(parent: Mapping[str, str], cpus: tuple[int, ...] | None = None,
                      role: str = "") -> dict[str, str]:
    """The children's environment: the launcher's, plus how OpenMP threads wait, unless the user chose.

    Processes share cores, and by default OpenMP threads spin after each parallel region, taking
    the cores another worker's forward needs (on 2 cores that made a 55M-parameter model's cluster
    requests 1.58x the in-process time; passive waiting brought it to 1.11x). So encoders and
    prefill workers, whose forwards are a few large operations, wait passively. Decode steps are
    hundreds of small operations, where sleeping threads double the step: decode (and colocated)
    threads spin briefly instead, and the engine runs small steps on one thread whenever other
    processes are busy (epd.threads.StepThreads), so the spinning never competes with them.
    """
    # Ports are per process: one EPD_PORT inherited by every child makes all but one fail to bind.
    # epd serve gives each child its port on the command line (0: a free one) instead.
    env = {key: value for key, value in parent.items() if key not in PER_PROCESS_VARIABLES}
    if "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env:
        if role in ("decode", "colocated"):
            env["GOMP_SPINCOUNT"] = "10000"
        else:
            env["OMP_WAIT_POLICY"] = "PASSIVE"
    if cpus:  # a pinned process runs one compute thread per CPU it has, not per CPU of the machine
        env.setdefault("OMP_NUM_THREADS", str(len(cpus)))
    return env


def workers_file_json(infos: list[dict], host: str) -> str:
    """The router's workers file (router/discovery.py) from the workers' ready files; a colocated
    worker serves all three roles; pure."""
    workers = [{"role": role, "address": info["address"], "metrics_url": f"http://{host}:{info['metrics_port']}/metrics"}
               for info in infos
               for role in (("encoder", "prefill", "decode") if info["role"] == "colocated" else (info["role"],))]
    return json.dumps({"workers": workers})


class StartupFailed(RuntimeError):
    pass


def wait_for_file(path: Path, timeout_s: float, check: Callable[[], None]) -> dict:
    """The JSON a starting process writes once ready; `check()` raises if waiting is pointless
    (the process died, a stop was asked for); StartupFailed after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        check()
        if time.monotonic() > deadline:
            raise StartupFailed(f"{path.stem} was not ready after {timeout_s:.0f} s")
        time.sleep(0.1)
    return json.loads(path.read_text())


def wait_for_router(url: str, timeout_s: float, check: Callable[[], None]) -> None:
    """Until the router at `url` says /ready (every role has a ready worker); `check` as above."""
    deadline = time.monotonic() + timeout_s
    while True:
        check()
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise StartupFailed(f"the router at {url} did not report ready in {timeout_s:.0f} s")
        time.sleep(0.2)


def epd_command() -> list[str]:
    """How to run `epd ...` so the process's command line names its role (`epd encoder ...`)."""
    script = Path(sys.executable).parent / "epd"
    if script.is_file():
        return [sys.executable, str(script)]
    found = shutil.which("epd")
    return [sys.executable, found] if found else [sys.executable, "-m", "epd"]


def child_setup(cpus: tuple[int, ...] | None = None):
    def setup() -> None:
        # Not Linux (no libc.so.6): the launcher's own signal handling still stops children.
        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if cpus:
            os.sched_setaffinity(0, cpus)

    return setup


@dataclass(eq=False)
class Child:
    """One process of the cluster and what supervising it needs."""

    name: str
    role: str
    args: list[str]  # its command line after `epd`, ports not pinned
    proc: subprocess.Popen
    ready_file: Path
    address: str = ""  # once ready: where it serves (a restart binds the same ports)
    metrics_port: int = 0
    ready_at: float | None = None  # monotonic time it last became ready; None since its last start
    restart_at: float | None = None  # dead, to be started again at this monotonic time
    gave_up: str = ""  # why it is not restarted any more
    history: RestartState = field(default_factory=RestartState)

    def alive(self) -> bool:
        return self.proc.poll() is None


class Cluster:
    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self.children: list[Child] = []
        self.stop_requested = False  # set from the signal handler; start() gives up at its next check
        self.run_dir = Path(tempfile.mkdtemp(prefix="epd-serve-"))
        self.affinity = (plan_affinity(options.cpu_affinity, options.processes(), available_cpus())
                         if options.cpu_affinity else {})
        self.gpu_plan = (assign_gpus(options.processes(), parse_gpus(options.gpus, visible_gpus()))
                         if options.gpus is not None else {})

    def start(self) -> str:
        """Start every process; return the router's base URL once the cluster is ready."""
        o = self.options
        workers = []  # their ready files
        for name, role in o.processes()[:-1]:
            ready = self.run_dir / f"{name}.json"
            args = [role, "--model", o.model_dir, "--host", o.host, "--ready-file", str(ready),
                    "--log-level", o.log_level, "--dtype", o.dtype, "--device", o.device, *self._tracing_args()]
            if role != "decode":
                args += ["--transfer", o.transfer]
            args += list(passed_to(role, o.engine_args))
            self._spawn(name, role, args, ready)
            workers.append(ready)
        router_ready = self.run_dir / "router.json"
        args = ["router", "--model", o.model_dir, "--host", o.host, "--port", str(o.port),
                "--grpc-port", str(o.grpc_port), "--ready-file", str(router_ready), "--log-level", o.log_level,
                "--supervision-file", str(self.supervision_file), "--workers-file", str(self.workers_file)]
        for host in o.allow_url_hosts:
            args += ["--allow-url-host", host]
        args += self._tracing_args()
        self._spawn("router", "router", args, router_ready)
        infos = [self._wait_file(path) for path in workers]
        now = time.monotonic()
        for child, info in zip(self.children[:len(infos)], infos, strict=True):
            child.address, child.metrics_port, child.ready_at = info["address"], int(info["metrics_port"]), now
        self.write_supervision()
        write_atomically(self.workers_file, workers_file_json(infos, o.host))
        router = self._wait_file(router_ready)
        url = f"http://{o.host}:{router['http_port']}"
        self._wait_ready(url)
        self.grpc_address = f"{o.host}:{router['grpc_port']}"
        return url

    def stop(self, timeout_s: float = 10.0) -> None:
        """Router first (no new work), then workers; SIGKILL whatever outlives the timeout."""
        for child in reversed(self.children):
            if child.alive():
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in [c.proc for c in reversed(self.children)]:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        shutil.rmtree(self.run_dir, ignore_errors=True)

    def _tracing_args(self) -> list[str]:
        return ["--otlp-endpoint", self.options.otlp_endpoint] if self.options.otlp_endpoint else []

    def dead_child(self) -> tuple[str, int] | None:
        for child in self.children:
            if not child.alive():
                return child.name, child.proc.returncode
        return None

    def _spawn(self, name: str, role: str, args: list[str], ready_file: Path) -> None:
        self.children.append(Child(name, role, args, self._popen(name, args), ready_file))

    def _popen(self, name: str, args: list[str]) -> subprocess.Popen:
        # A session of its own: Ctrl-C in the terminal reaches only the launcher, which then stops
        # the router first and the workers after it, instead of every process racing to exit.
        cpus = self.affinity.get(name)
        env = child_environment(os.environ, cpus, name.rsplit("-", 1)[0])
        if name in self.gpu_plan:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu_plan[name]
        return subprocess.Popen(epd_command() + args, preexec_fn=child_setup(cpus), stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)

    @property
    def workers_file(self) -> Path:
        return self.run_dir / "workers.json"

    @property
    def supervision_file(self) -> Path:
        return self.run_dir / "supervision.json"

    def write_supervision(self) -> None:
        """Per worker address: its name, restarts and state, for the router's /workers (atomic replace)."""
        table = {c.address: {"name": c.name, "restarts": c.history.restarts,
                             "state": "gave_up" if c.gave_up else "restarting" if c.restart_at else "running",
                             "gave_up": c.gave_up} for c in self.children if c.address}
        write_atomically(self.supervision_file, json.dumps({"workers": table}))

    def supervise(self) -> str | None:
        """One look at every child once serving: note readiness, restart the dead when due.

        Returns why the cluster must stop (the router died, or a role has no worker left), else None.
        """
        now, changed = time.monotonic(), False
        for child in self.children:
            if child.role == "router":
                if not child.alive():
                    return f"router exited with code {child.proc.returncode}"
                continue
            if child.gave_up:
                continue
            if child.alive():
                if child.ready_at is None and child.ready_file.exists():
                    child.ready_at = now
                    print(f"epd serve: {child.name} is ready again at {child.address}", file=sys.stderr, flush=True)
            elif child.restart_at is None:
                changed = True
                self._on_death(child, now)
                if child.gave_up and not self._role_alive(child.role):
                    self.write_supervision()
                    return f"no {child.role} worker left: gave up on {child.name}: {child.gave_up}"
            elif now >= child.restart_at:
                changed = True
                self._restart(child)
        if changed:
            self.write_supervision()
        return None

    def _on_death(self, child: Child, now: float) -> None:
        code, was_ready = child.proc.returncode, child.ready_at is not None
        delay = child.history.on_exit(self.options.restart, code, was_ready,
                                      now - child.ready_at if was_ready else 0.0)
        if delay is None:
            child.gave_up = child.history.give_up_reason()
            print(f"epd serve: {child.name} exited with code {code}; not restarting it: {child.gave_up}",
                  file=sys.stderr, flush=True)
            return
        child.restart_at = now + delay
        print(f"epd serve: {child.name} exited with code {code}; restarting it in {delay:.1f} s "
              f"(the other workers keep serving)", file=sys.stderr, flush=True)

    def _restart(self, child: Child) -> None:
        """The same command on the same ports: the router's registry sees the address come back."""
        child.ready_file.unlink(missing_ok=True)
        port = child.address.rsplit(":", 1)[1]
        args = [*child.args, "--port", port, "--metrics-port", str(child.metrics_port)]
        child.proc = self._popen(child.name, args)
        child.restart_at, child.ready_at = None, None
        child.history.restarts += 1

    def _role_alive(self, role: str) -> bool:
        return any(c.role == role and not c.gave_up for c in self.children)

    def _wait_file(self, path: Path) -> dict:
        return wait_for_file(path, self.options.start_timeout_s, self._check_children)

    def _wait_ready(self, url: str) -> None:
        wait_for_router(url, self.options.start_timeout_s, self._check_children)

    def _check_children(self) -> None:
        if self.stop_requested:
            raise StartupFailed("stopped by a signal before the cluster was ready")
        dead = self.dead_child()
        if dead:
            name, code = dead
            raise StartupFailed(f"{name} exited with code {code} before the cluster was ready (its message is above)")


def serve(options: ServeOptions) -> int:
    """Run until SIGTERM / SIGINT, the router dies or a role is given up on; exit code 0 on a requested stop."""
    cluster = Cluster(options)

    def request_stop(*_) -> None:
        cluster.stop_requested = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, request_stop)
    try:
        url = cluster.start()
        if cluster.affinity:
            pins = ", ".join(f"{name}={'+'.join(map(str, cpus))}" for name, cpus in cluster.affinity.items())
            print(f"epd serve: CPU affinity {pins}", flush=True)
        print(f"EPD cluster ready: {url}/v1 (OpenAI-compatible; gRPC Router at {cluster.grpc_address}); "
              f"Ctrl-C stops it", flush=True)
        while not cluster.stop_requested:
            fatal = cluster.supervise()
            if fatal:
                print(f"epd serve: {fatal}; stopping the cluster", file=sys.stderr)
                return 1
            time.sleep(0.2)
        return 0
    except StartupFailed as exc:
        print(f"epd serve: {exc}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()
