"""epd serve's restart policy: backoff on repeated deaths, giving up only on repeated failures at start."""

import pytest

from epd.supervision import RestartPolicy, RestartState

POLICY = RestartPolicy(base_s=0.5, max_s=4.0, give_up_after=3, stable_s=30.0)


def test_deaths_after_ready_back_off_exponentially_up_to_the_cap():
    state = RestartState()
    delays = [state.on_exit(POLICY, -9, was_ready=True, up_s=1.0) for _ in range(6)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]  # never gives up on a worker that keeps becoming ready


def test_a_restart_that_stayed_up_resets_the_backoff():
    state = RestartState()
    assert [state.on_exit(POLICY, -9, True, 1.0) for _ in range(3)] == [0.5, 1.0, 2.0]
    assert state.on_exit(POLICY, -9, True, 31.0) == 0.5


def test_gives_up_after_repeated_failures_at_start_and_says_why():
    state = RestartState()
    assert state.on_exit(POLICY, -9, True, 100.0) == 0.5  # the death that started it all
    assert state.on_exit(POLICY, 1, False, 0.2) == 1.0
    assert state.on_exit(POLICY, 1, False, 0.2) == 2.0
    assert state.on_exit(POLICY, 2, False, 0.2) is None
    assert state.give_up_reason() == "it failed 3 times in a row before becoming ready (exit code 1, exit code 1, " \
                                     "exit code 2)"


def test_becoming_ready_in_between_clears_the_failures_at_start():
    state = RestartState()
    for _ in range(2):
        assert state.on_exit(POLICY, 1, False, 0.1) is not None
    assert state.on_exit(POLICY, -9, True, 5.0) is not None  # it made it to ready once
    for _ in range(2):
        assert state.on_exit(POLICY, 1, False, 0.1) is not None
    assert state.on_exit(POLICY, 1, False, 0.1) is None


def test_bad_policies_are_refused():
    with pytest.raises(ValueError):
        RestartPolicy(base_s=5, max_s=1)
    with pytest.raises(ValueError):
        RestartPolicy(give_up_after=0)
