"""The Ray actors behind `epd ray up`: one per worker, and the controller that owns them and the router.

Plain classes here; `ray.remote` is applied where they are placed (epd/ray_cluster/api.py), so
this module imports without Ray doing anything. Ray's own control plane carries the calls (the
spec as a dict, member lists); nothing of ours goes over it.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path

from epd.files import write_atomically
from epd.launcher import wait_for_router
from epd.ray_cluster.plan import (
    WORKER_ROLES,
    Member,
    RayClusterSpec,
    check_count,
    member_from_ready,
    plan_scale,
    workers_file_text,
)
from epd.ray_cluster.process import ChildProcess
from epd.ray_cluster.replacement import STARTED, STOPPING, replace_with_backoff
from epd.supervision import RestartPolicy, RestartState

log = logging.getLogger(__name__)
RESTART_POLICY = RestartPolicy()  # the one `epd serve` uses


class WorkerActor:
    """Holds one worker's Ray resources and runs the worker as its child process."""

    def __init__(self, name: str, role: str, args: list[str]) -> None:
        import ray

        self.node_ip = ray.util.get_node_ip_address()
        args = [self.node_ip if a == "{node_ip}" else a for a in args]
        self.child = ChildProcess(name, args, role)

    def wait_ready(self, timeout_s: float) -> dict:
        return {**self.child.wait_ready(timeout_s), "node_ip": self.node_ip}

    def exit_code(self) -> int | None:
        return self.child.exit_code()

    def stop(self, timeout_s: float = 10.0) -> int | None:
        return self.child.stop(timeout_s)


def spec_from_dict(data: dict) -> RayClusterSpec:
    tuples = {k: tuple(v) for k, v in data.items() if isinstance(v, list)}
    return RayClusterSpec(**{**data, **tuples})


class Controller:
    """Owns the worker actors and the router process; the one place membership changes.

    The router re-reads the workers file this writes (its FileDiscovery), so adding a worker is
    "ready, then listed", and removing one is "unlisted, drained by the router, then stopped":
    no request is ever routed to a worker that is about to stop.
    """

    def __init__(self, spec: dict) -> None:
        self.spec = spec_from_dict(spec)
        self.run_dir = Path(tempfile.mkdtemp(prefix="epd-ray-controller-"))
        self.workers_file = self.run_dir / "workers.json"
        self.members: dict[str, Member] = {}
        self.actors: dict[str, tuple[str, object]] = {}  # name -> (role, actor handle)
        self.numbers = dict.fromkeys(WORKER_ROLES, 0)
        self.router: ChildProcess | None = None
        self.url = ""
        self.grpc_address = ""
        self.restarts = dict.fromkeys(WORKER_ROLES, 0)
        self.gave_up: dict[str, str] = {}  # role -> why a dead worker of it was not replaced
        self._histories = {role: RestartState() for role in WORKER_ROLES}  # one replacement slot per role
        self._ready_at: dict[str, float] = {}  # name -> when it was listed
        self._state = threading.Lock()  # members / actors / numbers
        self._scaling = threading.Lock()  # one scale (or start, or stop) at a time
        self._stopping = threading.Event()

    # --- life -------------------------------------------------------------------------------

    def start(self) -> dict:
        with self._scaling:
            self._publish()
            for role in WORKER_ROLES:
                self._start_workers(role, self.spec.count(role))
            self.router = ChildProcess("router", self.spec.router_command(str(self.workers_file), "{ready}"),
                                       "router", str(self.run_dir))
            info = self.router.wait_ready(self.spec.start_timeout_s)
            host = self.spec.host if self.spec.host not in ("0.0.0.0", "::") else self._node_ip()
            self.url = f"http://{host}:{info['http_port']}"
            self.grpc_address = f"{host}:{info['grpc_port']}"
            wait_for_router(self.url, self.spec.start_timeout_s, self.router.check_alive)
        threading.Thread(target=self._watch, name="epd-ray-watch", daemon=True).start()
        return {"url": self.url, "grpc_address": self.grpc_address}

    def stop(self) -> None:
        """Router first (no new work), then every worker, then the folder of the workers file."""
        self._stopping.set()
        with self._scaling:
            if self.router:
                self.router.stop()
            with self._state:
                actors = list(self.actors.values())
                self.actors.clear()
                self.members.clear()
            self._stop_actors([handle for _, handle in actors])
            shutil.rmtree(self.run_dir, ignore_errors=True)

    # --- scaling ----------------------------------------------------------------------------

    def scale(self, role: str, n: int) -> dict:
        check_count(role, n)
        with self._scaling:
            current = self._names(role)
            plan = plan_scale(current, n)
            if plan.start:
                added = self._start_workers(role, plan.start)
                self._wait_routed({m.address for m in added})
            if plan.drain:
                self._drain(plan.drain)
        return self.status()

    def status(self) -> dict:
        with self._state:
            return {"url": self.url, "grpc_address": self.grpc_address, "restarts": dict(self.restarts),
                    "gave_up": dict(self.gave_up),
                    "workers": [asdict(m) for m in sorted(self.members.values(), key=lambda m: (m.role, m.name))]}

    # --- internals ----------------------------------------------------------------------------

    def _names(self, role: str) -> list[str]:
        with self._state:
            names = [name for name, (r, _) in self.actors.items() if r == role]
        return sorted(names, key=lambda name: int(name.rsplit("-", 1)[1]))  # oldest first

    def _start_workers(self, role: str, count: int) -> list[Member]:
        """Start `count` workers of `role`, wait until each is ready, then list them for the router."""
        import ray

        from epd.ray_cluster.api import worker_actor_class

        started = []
        for _ in range(count):
            with self._state:
                name = f"{role}-{self.numbers[role]}"
                self.numbers[role] += 1
            args = self.spec.worker_command(role, "{ready}")
            started.append((name, worker_actor_class(self.spec).remote(name, role, args)))
        try:
            infos = ray.get([actor.wait_ready.remote(self.spec.start_timeout_s) for _, actor in started],
                            timeout=self.spec.start_timeout_s + 30)
        except Exception:
            self._stop_actors([actor for _, actor in started])
            raise
        added = [member_from_ready(name, info, info["node_ip"], self.spec.worker_host)
                 for (name, _), info in zip(started, infos, strict=True)]
        with self._state:
            for (name, actor), member in zip(started, added, strict=True):
                self.actors[name] = (role, actor)
                self.members[name] = member
                self._ready_at[name] = time.monotonic()
        self._publish()
        return added

    def _drain(self, names: list[str]) -> None:
        """Unlist, wait until the router no longer lists them (drained: nothing in flight), stop."""
        with self._state:
            leaving = [self.members.pop(name) for name in names if name in self.members]
        self._publish()
        addresses = {m.address for m in leaving}
        deadline = time.monotonic() + self.spec.drain_timeout_s
        while time.monotonic() < deadline:
            listed = self._router_addresses()
            if listed is not None and not addresses & listed:
                break
            time.sleep(0.25)
        # The router has dropped them; a pull of a lease it handed out just before may still run:
        # the worker's SIGTERM grace lets calls in flight finish.
        time.sleep(1.0)
        with self._state:
            handles = [self.actors.pop(name)[1] for name in names if name in self.actors]
        self._stop_actors(handles)

    def _wait_routed(self, addresses: set[str]) -> None:
        """Until the router routes to every one of `addresses` (scale returns when they take traffic)."""
        deadline = time.monotonic() + self.spec.start_timeout_s
        while time.monotonic() < deadline and not addresses <= (self._router_addresses(state="ready") or set()):
            time.sleep(0.25)

    def _router_addresses(self, state: str | None = None) -> set[str] | None:
        """The workers the router lists (in `state`, if given); None when the router can't be asked."""
        try:
            with urllib.request.urlopen(f"{self.url}/workers", timeout=2) as reply:
                return {w["address"] for w in json.loads(reply.read())["workers"]
                        if state is None or w["state"] == state}
        except (OSError, ValueError, KeyError):
            return None  # unknown: the caller keeps waiting (bounded by its timeout)

    def _stop_actors(self, handles: list) -> None:
        import ray

        waits = [handle.stop.remote() for handle in handles]
        try:
            ray.get(waits, timeout=20)
        except Exception as exc:  # an actor already gone: nothing left to stop
            log.warning("stopping workers: %s", exc)
        for handle in handles:
            try:
                ray.kill(handle)
            except Exception as exc:
                log.warning("killing a worker actor: %s", exc)

    def _publish(self) -> None:
        with self._state:
            text = workers_file_text(list(self.members.values()))
        write_atomically(self.workers_file, text)

    def _watch(self) -> None:
        """Replace a worker whose process (or actor) died: unlist it at once, start another."""
        import ray

        while not self._stopping.wait(1.0):
            for role in WORKER_ROLES:
                for name in self._names(role):
                    with self._state:
                        handle = self.actors.get(name, (None, None))[1]
                    if handle is None:
                        continue
                    try:
                        code = ray.get(handle.exit_code.remote(), timeout=10)
                    except Exception:  # the actor itself is gone (its node died, say)
                        code = -1
                    if code is not None and not self._stopping.is_set():
                        self._replace(role, name, code)

    def _replace(self, role: str, name: str, code: int) -> None:
        """Unlist and stop the dead worker at once, then start another under the restart policy."""
        log.warning("%s exited with code %s: replacing it", name, code)
        with self._scaling:
            if self._stopping.is_set():
                return
            with self._state:
                self.members.pop(name, None)
                entry = self.actors.pop(name, None)
                up_s = time.monotonic() - self._ready_at.pop(name, time.monotonic())
                self.restarts[role] += 1
            self._publish()
            if entry:
                self._stop_actors([entry[1]])

        def start_one() -> None:
            with self._scaling:  # not held while backing off: scale calls go on meanwhile
                if not self._stopping.is_set():
                    self._start_workers(role, 1)

        outcome = replace_with_backoff(start_one, self._histories[role], RESTART_POLICY, code, up_s,
                                       self._stopping.wait)
        with self._state:
            if outcome == STARTED:
                self.gave_up.pop(role, None)
            elif outcome != STOPPING:
                log.error("gave up replacing a %s worker: %s", role, outcome)
                self.gave_up[role] = outcome

    def _node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()
