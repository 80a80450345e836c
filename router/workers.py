"""The router's view of its workers: who they are (from flags, DNS or a file), how they are (from the
standard gRPC health check).

A worker is routable only while `ready`. A failed check (NOT_SERVING, a refused connection) or a
call that found it UNAVAILABLE makes it `unhealthy`; `eject_after` consecutive failures make it
`ejected`; a SERVING answer re-admits it. Checks are bounded by `check_timeout_s`. A check that only
ran out of time is a slow worker, not a dead one: a busy machine (or a router busy parsing a burst
of requests) can take longer than the timeout to answer, and taking the only decode worker out for
that turns load into 503s. So a ready worker leaves routing after `timeouts_to_fail` timeouts in a
row (Kubernetes' failureThreshold, 3 by default there too): a hung worker costs a few seconds, a
dead one is out at its first refused check.

Membership changes at run time: each discovery source (router/discovery.py) reports the complete
set of workers it sees with `set_members`. A new worker starts `starting` and joins once healthy;
one that no source reports any more is `draining`: it takes no new request, and leaves (its
channel closed) once its requests in flight are done.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from epd import tls
from epd.worker import GRPC_OPTIONS

WORKER_STATES = ("starting", "ready", "unhealthy", "ejected", "draining")

log = logging.getLogger(__name__)
ROLES = ("encoder", "prefill", "decode")


@dataclass(frozen=True)
class WorkerSpec:
    role: str
    address: str
    metrics_url: str = ""

    @staticmethod
    def parse(role: str, text: str) -> WorkerSpec:
        """`host:port[,metrics=URL]`, as given on the command line."""
        address, *options = [p.strip() for p in text.split(",")]
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"--{role} {text!r}: expected host:port[,metrics=URL]")
        metrics_url = ""
        for option in options:
            key, _, value = option.partition("=")
            if key != "metrics" or not value:
                raise ValueError(f"--{role} {text!r}: unknown option {option!r} (only metrics=URL)")
            metrics_url = value
        return WorkerSpec(role, address, metrics_url)


@dataclass(eq=False)
class Worker:
    spec: WorkerSpec
    channel: grpc.aio.Channel
    state: str = "starting"  # starting | ready | unhealthy | ejected | draining
    failures: int = 0
    timeouts: int = 0  # health checks in a row that ran out of time while it was ready
    outstanding: int = 0  # requests in flight on this worker
    outstanding_tokens: int = 0  # prompt tokens in flight (prefill's load measure)
    last_error: str = field(default="", repr=False)

    @property
    def address(self) -> str:
        return self.spec.address

    @property
    def role(self) -> str:
        return self.spec.role


class WorkerRegistry:
    def __init__(self, specs: list[WorkerSpec], interval_s: float = 1.0, check_timeout_s: float = 1.0,
                 eject_after: int = 3, supervision_file: str | None = None, timeouts_to_fail: int = 3) -> None:
        self.specs = specs  # the static members, from the command line
        self.supervision_file = supervision_file  # written by `epd serve`: restarts per worker address
        self.interval_s = interval_s
        self.check_timeout_s = check_timeout_s
        self.eject_after = eject_after
        self.timeouts_to_fail = timeouts_to_fail
        self.workers: list[Worker] = []
        self._members: dict[str, set[WorkerSpec]] = {}  # discovery source -> the workers it reports
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self.set_members("static", self.specs)
        await self.poll_once()
        self._task = asyncio.create_task(self._poll_forever(), name="epd-health-poller")

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
        for w in self.workers:
            await w.channel.close()

    def set_members(self, source: str, specs) -> None:
        """`source` now sees exactly `specs`: add the new workers, drain the ones no source reports."""
        self._members[source] = set(specs)
        wanted = set().union(*self._members.values())
        known = {w.spec: w for w in self.workers}
        for spec in sorted(wanted - known.keys(), key=lambda s: (s.role, s.address)):
            log.info("%s %s discovered", spec.role, spec.address)
            self.workers.append(Worker(spec, tls.aio_channel(spec.address, options=GRPC_OPTIONS)))  # epd.tls
        for spec, worker in known.items():
            if spec not in wanted and worker.state != "draining":
                log.info("%s %s left discovery: draining", spec.role, spec.address)
                worker.state = "draining"
            elif spec in wanted and worker.state == "draining":
                worker.state = "starting"  # back before it left: health decides again

    async def _drop_drained(self) -> None:
        for worker in [w for w in self.workers if w.state == "draining" and w.outstanding <= 0]:
            self.workers.remove(worker)
            await worker.channel.close()
            log.info("%s %s drained and removed", worker.role, worker.address)

    def ready(self, role: str) -> list[Worker]:
        return [w for w in self.workers if w.role == role and w.state == "ready"]

    def is_ready(self) -> bool:
        return all(self.ready(role) for role in ROLES)

    def mark_failed(self, worker: Worker, reason: str) -> None:
        """A call found the worker unreachable: stop routing to it until a health check passes."""
        if worker.state == "draining":
            return
        worker.failures += 1
        before, worker.state = worker.state, "ejected" if worker.failures >= self.eject_after else "unhealthy"
        worker.last_error = reason
        if worker.state != before:
            log.warning("%s %s is %s: %s", worker.role, worker.address, worker.state, reason)

    def snapshot(self) -> list[dict]:
        supervised = self._supervision()
        return [{"role": w.role, "address": w.address, "metrics_url": w.spec.metrics_url, "state": w.state,
                 "outstanding": w.outstanding, "last_error": w.last_error,
                 "restarts": supervised.get(w.address, {}).get("restarts", 0)} for w in self.workers]

    def _supervision(self) -> dict[str, dict]:
        """The launcher's table (address -> {name, restarts, state}); empty without one or while unreadable."""
        if not self.supervision_file:
            return {}
        try:
            with open(self.supervision_file) as f:
                return dict(json.load(f)["workers"])
        except (OSError, ValueError, KeyError, TypeError):
            return {}

    async def poll_once(self) -> None:
        await self._drop_drained()
        await asyncio.gather(*(self._check(w) for w in self.workers if w.state != "draining"))
        self.export_states()

    def export_states(self) -> None:
        """`epd_workers{role, state}`: every (role, state) pair, 0 where none, so a count never goes stale."""
        from epd import metrics

        for role in ROLES:
            for state in WORKER_STATES:
                metrics.WORKERS.labels(role, state).set(sum(w.role == role and w.state == state for w in self.workers))

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.poll_once()
            except Exception:  # a poller that dies silently would freeze every state; log and go on
                log.exception("health poll failed")

    async def _check(self, worker: Worker) -> None:
        stub = health_pb2_grpc.HealthStub(worker.channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=self.check_timeout_s)
            serving = reply.status == health_pb2.HealthCheckResponse.SERVING
            reason = "" if serving else health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        except grpc.aio.AioRpcError as exc:
            serving, reason = False, f"{exc.code().name}: {exc.details()}"
            timed_out = exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        else:
            timed_out = False
        if worker.state == "draining":  # left discovery while the check ran
            return
        if serving:
            if worker.state != "ready":
                log.info("%s %s is ready", worker.role, worker.address)
            worker.state, worker.failures, worker.timeouts, worker.last_error = "ready", 0, 0, ""
        elif worker.state == "starting":
            worker.last_error = reason  # never ready yet (still loading): not routable, not an incident
        elif timed_out and worker.state == "ready" and worker.timeouts + 1 < self.timeouts_to_fail:
            worker.timeouts += 1  # slow, maybe busy: still routed (see the module's docstring)
            worker.last_error = f"{reason} ({worker.timeouts} in a row)"
        else:
            worker.timeouts = 0
            self.mark_failed(worker, reason)
