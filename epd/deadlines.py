"""Deadlines: absolute epoch milliseconds on the wire, turned into bounded waits at each hop."""

from __future__ import annotations

import time


def remaining_s(deadline_ms: int, call_left_s: float | None, default_s: float) -> float:
    """Seconds left before the request's absolute deadline and the call's own, else `default_s`.

    Raises TimeoutError when nothing is left, so a late request never starts work.
    """
    limits = [deadline_ms / 1000 - time.time()] if deadline_ms > 0 else []
    if call_left_s is not None:
        limits.append(call_left_s)
    budget = min(limits) if limits else default_s
    if budget <= 0:
        raise TimeoutError("the request's deadline has passed")
    return budget


def deadline_ms_in(seconds: float) -> int:
    """The absolute deadline `seconds` from now, in epoch milliseconds."""
    return int((time.time() + seconds) * 1000)
