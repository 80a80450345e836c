"""replace_with_backoff: the restart policy's delays between attempts, giving up, stopping — no Ray, no sleeping."""

from __future__ import annotations

from epd.ray_cluster.replacement import STARTED, STOPPING, replace_with_backoff
from epd.supervision import RestartPolicy, RestartState

POLICY = RestartPolicy(base_s=0.5, max_s=4.0, give_up_after=3, stable_s=30.0)


class Clock:
    """Records each wait; `stop_at` makes the n-th wait report that the cluster is stopping."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.waits: list[float] = []
        self.stop_at = stop_at

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        return self.stop_at is not None and len(self.waits) >= self.stop_at


def starter(failures: int):
    """start() that raises `failures` times, then succeeds; counts its calls."""
    calls = []

    def start() -> None:
        calls.append(1)
        if len(calls) <= failures:
            raise RuntimeError(f"no room on any node (try {len(calls)})")

    return start, calls


def test_a_death_after_a_long_stable_run_is_replaced_after_the_base_delay():
    start, calls = starter(0)
    history, clock = RestartState(), Clock()
    assert replace_with_backoff(start, history, POLICY, -9, 60.0, clock.wait) == STARTED
    assert clock.waits == [0.5] and len(calls) == 1 and history.restarts == 1


def test_quick_deaths_in_a_row_double_the_delay_up_to_the_cap():
    history, clock = RestartState(), Clock()
    for _ in range(5):
        replace_with_backoff(starter(0)[0], history, POLICY, 1, 2.0, clock.wait)
    assert clock.waits == [0.5, 1.0, 2.0, 4.0, 4.0]


def test_a_replacement_that_fails_to_start_is_tried_again_later():
    start, calls = starter(1)
    history, clock = RestartState(), Clock()
    assert replace_with_backoff(start, history, POLICY, 1, 60.0, clock.wait) == STARTED
    assert clock.waits == [0.5, 1.0] and len(calls) == 2 and history.start_failures == 1


def test_it_gives_up_after_give_up_after_failed_starts_and_says_why():
    start, calls = starter(10)
    history, clock = RestartState(), Clock()
    reason = replace_with_backoff(start, history, POLICY, 1, 60.0, clock.wait)
    assert len(calls) == 3 and clock.waits == [0.5, 1.0, 2.0]
    assert reason.startswith("it failed 3 times in a row before becoming ready")
    assert "RuntimeError: no room on any node (try 3)" in reason


def test_stopping_while_backing_off_starts_nothing():
    start, calls = starter(0)
    assert replace_with_backoff(start, RestartState(), POLICY, 1, 60.0, Clock(stop_at=1).wait) == STOPPING
    assert calls == []
