"""ModelGate: one forward at a time across threads, a bounded wait, and an exact queue-depth gauge."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
from prometheus_client import REGISTRY

from epd.model_gate import ModelGate
from epd.rpc_errors import Overloaded

_ids = itertools.count()


def unique_role() -> str:
    return f"test-gate-{next(_ids)}"  # each test its own label, so gauges never mix


def depth(role: str) -> float | None:
    return REGISTRY.get_sample_value("epd_queue_depth", {"role": role})


def wait_until(predicate, timeout_s: float = 2.0) -> None:
    end = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.002)


class Holder:
    """A thread that holds the gate's turn until `release` is set."""

    def __init__(self, gate: ModelGate) -> None:
        self.gate, self.inside, self.release = gate, threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.inside.wait(2.0)

    def _run(self) -> None:
        with self.gate.turn(timeout_s=5.0):
            self.inside.set()
            self.release.wait(5.0)

    def stop(self) -> None:
        self.release.set()
        self.thread.join(2.0)
        assert not self.thread.is_alive()


class Waiter:
    """A thread that asks for a turn and records what happened."""

    def __init__(self, gate: ModelGate, timeout_s: float = 5.0) -> None:
        self.gate, self.timeout_s, self.outcome = gate, timeout_s, None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            with self.gate.turn(self.timeout_s):
                self.outcome = "granted"
        except Exception as exc:  # recorded for the assertion
            self.outcome = exc

    def join(self) -> None:
        self.thread.join(2.0)
        assert not self.thread.is_alive()


def test_gauge_is_zero_before_and_after_an_uncontended_turn():
    role = unique_role()
    gate = ModelGate(role, max_waiting=2)
    assert depth(role) == 0.0
    with gate.turn(timeout_s=1.0):
        assert depth(role) == 0.0  # holding the turn is not waiting
    assert depth(role) == 0.0


def test_turns_are_exclusive_across_threads():
    gate = ModelGate(unique_role(), max_waiting=16)
    active, peak, lock = [0], [0], threading.Lock()

    def work() -> None:
        for _ in range(20):
            with gate.turn(timeout_s=5.0):
                with lock:
                    active[0] += 1
                    peak[0] = max(peak[0], active[0])
                time.sleep(0.0005)
                with lock:
                    active[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10.0)
    assert peak[0] == 1
    assert active[0] == 0


def test_waiter_is_counted_in_the_gauge_then_granted_when_released():
    role = unique_role()
    gate = ModelGate(role, max_waiting=2)
    holder = Holder(gate)
    waiter = Waiter(gate)
    wait_until(lambda: depth(role) == 1.0)
    assert waiter.outcome is None  # still waiting while the holder has the model
    holder.stop()
    waiter.join()
    assert waiter.outcome == "granted"
    assert depth(role) == 0.0


def test_overloaded_when_max_waiting_already_wait():
    role = unique_role()
    gate = ModelGate(role, max_waiting=2)
    holder = Holder(gate)
    waiters = [Waiter(gate), Waiter(gate)]
    wait_until(lambda: depth(role) == 2.0)
    with (
        pytest.raises(Overloaded, match="2 requests already wait for the model; try again later"),
        gate.turn(timeout_s=5.0),
    ):
        pytest.fail("a turn was granted past max_waiting")
    assert depth(role) == 2.0  # the refused request was never counted
    holder.stop()
    for w in waiters:
        w.join()
    assert [w.outcome for w in waiters] == ["granted", "granted"]
    assert depth(role) == 0.0


def test_max_waiting_zero_refuses_even_an_idle_gate():
    gate = ModelGate(unique_role(), max_waiting=0)
    with pytest.raises(Overloaded), gate.turn(timeout_s=1.0):
        pass


def test_timeout_when_the_turn_is_not_granted_in_time():
    role = unique_role()
    gate = ModelGate(role, max_waiting=2)
    holder = Holder(gate)
    started = time.monotonic()
    with (
        pytest.raises(TimeoutError, match="waited 0.1 s for the model without getting a turn"),
        gate.turn(timeout_s=0.1),
    ):
        pytest.fail("granted while another thread held the model")
    assert 0.09 <= time.monotonic() - started < 1.0
    assert depth(role) == 0.0  # the timed-out waiter left the queue
    holder.stop()
    with gate.turn(timeout_s=0.5):  # the gate is usable again: the timeout released nothing it did not hold
        pass


def test_negative_timeout_is_an_immediate_try():
    gate = ModelGate(unique_role(), max_waiting=2)
    holder = Holder(gate)
    started = time.monotonic()
    with pytest.raises(TimeoutError), gate.turn(timeout_s=-3.0):
        pass
    assert time.monotonic() - started < 0.5
    holder.stop()


def test_an_exception_inside_the_turn_releases_the_model():
    role = unique_role()
    gate = ModelGate(role, max_waiting=1)
    with pytest.raises(RuntimeError, match="forward failed"), gate.turn(timeout_s=1.0):
        raise RuntimeError("forward failed")
    with gate.turn(timeout_s=0.2):
        pass
    assert depth(role) == 0.0


def test_gates_of_different_roles_are_independent():
    a, b = ModelGate(unique_role(), max_waiting=1), ModelGate(unique_role(), max_waiting=1)
    holder = Holder(a)
    with b.turn(timeout_s=0.2):
        pass
    holder.stop()
