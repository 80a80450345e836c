"""Admission: a hard bound on the router's in-flight requests, and a scope closed exactly once."""

from __future__ import annotations

import asyncio

import pytest

from router.admission import Admission, RequestScope


def test_admission_refuses_beyond_the_limit_and_reports_each_change():
    seen: list[int] = []
    admission = Admission(2, on_change=seen.append)
    assert [admission.try_enter() for _ in range(3)] == [True, True, False]
    admission.leave()
    assert admission.try_enter() is True
    assert seen == [1, 2, 1, 2]
    assert admission.in_flight == 2


def test_admission_limit_must_be_positive():
    with pytest.raises(ValueError, match="limit"):
        Admission(0)


def test_scope_closes_once_releasing_the_slot_counting_and_closing_the_stream():
    closed: list[str] = []

    async def events():
        try:
            yield 1
            yield 2
        finally:
            closed.append("stream")

    async def run() -> tuple[list[str], int]:
        admission = Admission(1)
        assert admission.try_enter()
        counted: list[str] = []
        scope = RequestScope(admission, counted.append)
        scope.events = events()
        assert await anext(scope.events) == 1
        await scope.close("ok")
        await scope.close("cancelled")  # the background task's second call is a no-op
        return counted, admission.in_flight

    counted, in_flight = asyncio.run(run())
    assert counted == ["ok"]
    assert in_flight == 0
    assert closed == ["stream"]
