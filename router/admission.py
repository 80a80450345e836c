"""How many requests the router works on at once, and each request's bookkeeping.

Beyond the limit a request is refused at once (HTTP 429 / RESOURCE_EXHAUSTED) instead of queueing:
no unbounded queue in front of the workers, and the client learns at once that it should back off.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from router.orchestrator import aclose_quietly


class Admission:
    def __init__(self, limit: int, on_change: Callable[[int], None] | None = None) -> None:
        if limit < 1:
            raise ValueError(f"the router's request limit must be >= 1, got {limit}")
        self.limit = limit
        self.in_flight = 0
        self._on_change = on_change or (lambda n: None)

    def try_enter(self) -> bool:
        # Called from one event loop only: the check and the increment cannot interleave.
        if self.in_flight >= self.limit:
            return False
        self.in_flight += 1
        self._on_change(self.in_flight)
        return True

    def leave(self) -> None:
        self.in_flight -= 1
        self._on_change(self.in_flight)


class RequestScope:
    """One admitted request: its slot, its outcome count and its token stream, closed exactly once
    on whichever path ends it (reply sent, error, stream finished, client gone)."""

    def __init__(self, admission: Admission, count: Callable[[str], None]) -> None:
        self.admission = admission
        self.count = count
        self.events: AsyncIterator | None = None
        self.closed = False

    async def close(self, status: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.admission.leave()
        self.count(status)
        if self.events is not None:
            await aclose_quietly(self.events)
