"""remaining_s and deadline_ms_in: absolute epoch-ms deadlines turned into bounded waits."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from epd import deadlines
from epd.deadlines import deadline_ms_in, remaining_s

NOW = 1_700_000_000.0  # a fixed epoch second, so every expected value is exact


@pytest.fixture
def frozen(monkeypatch):
    monkeypatch.setattr(deadlines, "time", SimpleNamespace(time=lambda: NOW))


def test_deadline_alone_gives_seconds_until_it(frozen):
    assert remaining_s(int(NOW * 1000) + 2500, None, default_s=30.0) == pytest.approx(2.5, abs=1e-9)


def test_call_left_alone_is_used_as_is(frozen):
    assert remaining_s(0, 4.0, default_s=30.0) == 4.0


def test_call_left_alone_replaces_a_smaller_default(frozen):
    assert remaining_s(0, 40.0, default_s=30.0) == 40.0  # as a 40 s deadline_ms alone would give 40.0


def test_both_give_the_smaller_when_call_is_shorter(frozen):
    assert remaining_s(int(NOW * 1000) + 5000, 1.5, default_s=30.0) == 1.5


def test_both_give_the_smaller_when_deadline_is_shorter(frozen):
    assert remaining_s(int(NOW * 1000) + 1000, 7.0, default_s=30.0) == pytest.approx(1.0, abs=1e-9)


def test_neither_gives_the_default(frozen):
    assert remaining_s(0, None, default_s=12.0) == 12.0


def test_deadline_replaces_the_default_even_when_longer(frozen):
    assert remaining_s(int(NOW * 1000) + 60_000, None, default_s=12.0) == pytest.approx(60.0, abs=1e-9)


def test_passed_deadline_raises_timeout(frozen):
    with pytest.raises(TimeoutError, match="deadline has passed"):
        remaining_s(int(NOW * 1000) - 1, None, default_s=30.0)


def test_deadline_exactly_now_raises_timeout(frozen):
    with pytest.raises(TimeoutError):
        remaining_s(int(NOW * 1000), None, default_s=30.0)


def test_exhausted_call_budget_raises_timeout(frozen):
    with pytest.raises(TimeoutError):
        remaining_s(int(NOW * 1000) + 5000, 0.0, default_s=30.0)


def test_non_positive_default_raises_timeout(frozen):
    with pytest.raises(TimeoutError):
        remaining_s(0, None, default_s=0.0)


def test_deadline_ms_in_is_now_plus_seconds_in_ms(frozen):
    assert deadline_ms_in(2.5) == int(NOW * 1000) + 2500
    assert isinstance(deadline_ms_in(2.5), int)


def test_deadline_ms_in_uses_the_real_clock():
    before = time.time()
    value = deadline_ms_in(10.0)
    after = time.time()
    assert int((before + 10.0) * 1000) <= value <= int((after + 10.0) * 1000)


def test_round_trip_through_remaining_s():
    left = remaining_s(deadline_ms_in(5.0), None, default_s=99.0)
    assert 4.9 < left <= 5.0
