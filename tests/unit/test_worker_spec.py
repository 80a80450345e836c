"""WorkerSpec.parse (the --encoder/--prefill/--decode flags) and WorkerRegistry's state logic, without a network."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2

from router.workers import ROLES, Worker, WorkerRegistry, WorkerSpec

# --- WorkerSpec.parse ---------------------------------------------------------------------------------


def test_parse_host_port():
    assert WorkerSpec.parse("encoder", "10.0.0.5:50051") == WorkerSpec("encoder", "10.0.0.5:50051", "")


def test_parse_strips_whitespace():
    assert WorkerSpec.parse("decode", " localhost:7000 ") == WorkerSpec("decode", "localhost:7000", "")


def test_parse_with_metrics_url():
    spec = WorkerSpec.parse("prefill", "host-a:9000,metrics=http://host-a:9100/metrics")
    assert spec == WorkerSpec("prefill", "host-a:9000", "http://host-a:9100/metrics")


def test_parse_metrics_url_may_contain_equals_signs():
    spec = WorkerSpec.parse("prefill", "h:1,metrics=http://h:2/m?a=b")
    assert spec.metrics_url == "http://h:2/m?a=b"


def test_parse_ipv6_brackets_keep_the_last_colon_as_port():
    assert WorkerSpec.parse("decode", "[::1]:50051").address == "[::1]:50051"


@pytest.mark.parametrize("text", ["localhost", "localhost:", ":50051", "host:port", "host:50a", "", "host:-1"])
def test_parse_bad_address_names_the_flag(text):
    with pytest.raises(ValueError) as info:
        WorkerSpec.parse("encoder", text)
    assert str(info.value) == f"--encoder {text!r}: expected host:port[,metrics=URL]"


@pytest.mark.parametrize("option", ["metrics=", "metrics", "stats=http://x", "weight=2"])
def test_parse_bad_option_names_the_flag_and_option(option):
    text = f"h:1,{option}"
    with pytest.raises(ValueError) as info:
        WorkerSpec.parse("decode", text)
    assert str(info.value) == f"--decode {text!r}: unknown option {option!r} (only metrics=URL)"


# --- WorkerRegistry state --------------------------------------------------------------------------------


def make(role: str, address: str, state: str = "ready", metrics_url: str = "") -> Worker:
    return Worker(WorkerSpec(role, address, metrics_url), channel=object(), state=state)


def registry_with(*workers: Worker, eject_after: int = 3) -> WorkerRegistry:
    registry = WorkerRegistry([w.spec for w in workers], eject_after=eject_after)
    registry.workers = list(workers)
    return registry


def test_worker_exposes_role_and_address_of_its_spec():
    w = make("prefill", "p:1")
    assert (w.role, w.address, w.state, w.failures, w.outstanding) == ("prefill", "p:1", "ready", 0, 0)


def test_new_worker_starts_in_starting_state():
    assert Worker(WorkerSpec("encoder", "e:1"), channel=object()).state == "starting"


def test_registry_starts_without_workers_and_not_ready():
    registry = WorkerRegistry([WorkerSpec("encoder", "e:1")])
    assert registry.workers == []
    assert registry.is_ready() is False


def test_mark_failed_makes_unhealthy_then_ejected_after_eject_after():
    w = make("decode", "d:1")
    registry = registry_with(w, eject_after=3)
    registry.mark_failed(w, "UNAVAILABLE: one")
    assert (w.state, w.failures, w.last_error) == ("unhealthy", 1, "UNAVAILABLE: one")
    registry.mark_failed(w, "UNAVAILABLE: two")
    assert (w.state, w.failures, w.last_error) == ("unhealthy", 2, "UNAVAILABLE: two")
    registry.mark_failed(w, "UNAVAILABLE: three")
    assert (w.state, w.failures, w.last_error) == ("ejected", 3, "UNAVAILABLE: three")
    registry.mark_failed(w, "still down")
    assert (w.state, w.failures) == ("ejected", 4)


def test_eject_after_one_ejects_at_first_failure():
    w = make("decode", "d:1")
    registry_with(w, eject_after=1).mark_failed(w, "gone")
    assert w.state == "ejected"


def test_ready_lists_only_ready_workers_of_the_role_in_order():
    e1, e2, e3 = make("encoder", "e:1"), make("encoder", "e:2", state="unhealthy"), make("encoder", "e:3")
    p1 = make("prefill", "p:1")
    registry = registry_with(e1, p1, e2, e3)
    assert registry.ready("encoder") == [e1, e3]
    assert registry.ready("prefill") == [p1]
    assert registry.ready("decode") == []


@pytest.mark.parametrize("state", ["starting", "unhealthy", "ejected"])
def test_not_ready_states_are_not_routable(state):
    registry = registry_with(make("decode", "d:1", state=state))
    assert registry.ready("decode") == []


def test_is_ready_needs_a_ready_worker_of_every_role():
    workers = {role: make(role, f"{role}:1") for role in ROLES}
    registry = registry_with(*workers.values())
    assert registry.is_ready() is True
    for role in ROLES:
        workers[role].state = "unhealthy"
        assert registry.is_ready() is False, role
        workers[role].state = "ready"
    assert registry.is_ready() is True


def test_is_ready_false_when_a_role_has_no_worker_at_all():
    assert registry_with(make("encoder", "e:1"), make("prefill", "p:1")).is_ready() is False


def test_is_ready_true_when_one_of_several_per_role_is_ready():
    registry = registry_with(make("encoder", "e:1", state="ejected"), make("encoder", "e:2"),
                             make("prefill", "p:1"), make("decode", "d:1"), make("decode", "d:2", state="starting"))
    assert registry.is_ready() is True


def test_a_failed_call_takes_the_only_worker_of_a_role_out():
    workers = [make(role, f"{role}:1") for role in ROLES]
    registry = registry_with(*workers)
    registry.mark_failed(workers[1], "UNAVAILABLE")
    assert registry.ready("prefill") == []
    assert registry.is_ready() is False


def test_snapshot_reports_every_worker():
    w1 = make("encoder", "e:1", metrics_url="http://e:9/metrics")
    w2 = make("decode", "d:1", state="starting")
    w1.outstanding = 2
    registry = registry_with(w1, w2)
    registry.mark_failed(w2, "UNAVAILABLE: refused")
    assert registry.snapshot() == [
        {"role": "encoder", "address": "e:1", "metrics_url": "http://e:9/metrics", "state": "ready",
         "outstanding": 2, "last_error": "", "restarts": 0},
        {"role": "decode", "address": "d:1", "metrics_url": "", "state": "unhealthy", "outstanding": 0,
         "last_error": "UNAVAILABLE: refused", "restarts": 0},
    ]


# --- _check, against a fake channel ------------------------------------------------------------------------
# HealthStub(channel) only calls channel.unary_unary(...) and awaits what the returned callable gives back,
# so a fake channel can answer (or fail) the check without any socket.


class FakeAioRpcError(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class FakeHealthChannel:
    def __init__(self, answer) -> None:
        self.answer = answer  # a ServingStatus, or an exception to raise
        self.timeouts: list[float | None] = []

    def unary_unary(self, method, *_args, **_kwargs):
        if method != "/grpc.health.v1.Health/Check":
            return self._unexpected

        async def check(request, timeout=None, **_kw):
            assert request == health_pb2.HealthCheckRequest(service="")
            self.timeouts.append(timeout)
            if isinstance(self.answer, BaseException):
                raise self.answer
            return health_pb2.HealthCheckResponse(status=self.answer)

        return check

    unary_stream = unary_unary

    @staticmethod
    def _unexpected(*_args, **_kwargs):
        raise AssertionError("only Health/Check may be called")


def checked(worker: Worker, registry: WorkerRegistry) -> Worker:
    asyncio.run(registry._check(worker))
    return worker


def fake_worker(answer, state: str, failures: int = 0) -> Worker:
    w = Worker(WorkerSpec("prefill", "p:1"), channel=FakeHealthChannel(answer), state=state)
    w.failures = failures
    return w


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def test_check_serving_makes_ready_and_clears_failures():
    w = fake_worker(SERVING, state="ejected", failures=5)
    w.last_error = "old"
    registry = WorkerRegistry([w.spec], check_timeout_s=0.25)
    checked(w, registry)
    assert (w.state, w.failures, w.last_error) == ("ready", 0, "")
    assert w.channel.timeouts == [0.25]


def test_check_not_serving_while_starting_stays_starting():
    w = checked(fake_worker(NOT_SERVING, state="starting"), WorkerRegistry([]))
    assert (w.state, w.failures, w.last_error) == ("starting", 0, "NOT_SERVING")


def test_check_not_serving_when_ready_marks_unhealthy():
    w = checked(fake_worker(NOT_SERVING, state="ready"), WorkerRegistry([]))
    assert (w.state, w.failures, w.last_error) == ("unhealthy", 1, "NOT_SERVING")


def test_check_rpc_error_names_code_and_details():
    w = checked(fake_worker(FakeAioRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused"), state="ready"),
                WorkerRegistry([]))
    assert (w.state, w.failures, w.last_error) == ("unhealthy", 1, "UNAVAILABLE: connection refused")


TIMED_OUT = FakeAioRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")


def test_a_ready_worker_stays_routed_through_fewer_timeouts_than_timeouts_to_fail():
    w = fake_worker(TIMED_OUT, state="ready")
    registry = WorkerRegistry([w.spec], timeouts_to_fail=3)
    checked(w, registry)
    assert (w.state, w.failures, w.timeouts) == ("ready", 0, 1)
    checked(w, registry)
    assert (w.state, w.failures, w.timeouts, w.last_error) == (
        "ready", 0, 2, "DEADLINE_EXCEEDED: Deadline Exceeded (2 in a row)")
    checked(w, registry)
    assert (w.state, w.failures, w.timeouts) == ("unhealthy", 1, 0)


def test_an_answer_between_timeouts_starts_the_count_again():
    w = fake_worker(TIMED_OUT, state="ready")
    registry = WorkerRegistry([w.spec], timeouts_to_fail=2)
    checked(w, registry)
    w.channel.answer = SERVING
    checked(w, registry)
    w.channel.answer = TIMED_OUT
    checked(w, registry)
    assert (w.state, w.timeouts) == ("ready", 1)


def test_a_refused_check_takes_a_ready_worker_out_at_once_even_after_timeouts():
    w = fake_worker(TIMED_OUT, state="ready")
    registry = WorkerRegistry([w.spec], timeouts_to_fail=3)
    checked(w, registry)
    w.channel.answer = FakeAioRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused")
    checked(w, registry)
    assert (w.state, w.failures, w.timeouts) == ("unhealthy", 1, 0)


def test_check_timeouts_eject_after_consecutive_failures():
    w = fake_worker(TIMED_OUT, state="ready")
    registry = WorkerRegistry([w.spec], eject_after=2, timeouts_to_fail=1)
    checked(w, registry)
    assert w.state == "unhealthy"
    checked(w, registry)  # no longer ready: each timeout is a failure
    assert (w.state, w.failures, w.last_error) == ("ejected", 2, "DEADLINE_EXCEEDED: Deadline Exceeded")


def test_check_rpc_error_while_starting_is_not_an_incident():
    w = checked(fake_worker(FakeAioRpcError(grpc.StatusCode.UNAVAILABLE, "not up yet"), state="starting"),
                WorkerRegistry([]))
    assert (w.state, w.failures, w.last_error) == ("starting", 0, "UNAVAILABLE: not up yet")


def test_poll_once_checks_every_worker():
    up, down = fake_worker(SERVING, state="starting"), fake_worker(NOT_SERVING, state="ready")
    registry = WorkerRegistry([up.spec, down.spec])
    registry.workers = [up, down]
    asyncio.run(registry.poll_once())
    assert (up.state, down.state) == ("ready", "unhealthy")
