"""One model, many request threads: forwards run one at a time, with a bounded, measured wait.

Torch already uses every core inside one forward; running two at once would only thrash. The gate
bounds how many requests may wait (beyond that: Overloaded, i.e. RESOURCE_EXHAUSTED) and keeps the
role's queue-depth and running gauges exact.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from epd import metrics
from epd.rpc_errors import Overloaded


class ModelGate:
    def __init__(self, role: str, max_waiting: int) -> None:
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._waiting = 0
        self.max_waiting = max_waiting
        self._depth = metrics.QUEUE_DEPTH.labels(role)

    @contextmanager
    def turn(self, timeout_s: float) -> Iterator[None]:
        """Hold the model for one forward (or a few); TimeoutError if not granted within timeout_s."""
        with self._count_lock:
            if self._waiting >= self.max_waiting:
                raise Overloaded(f"{self._waiting} requests already wait for the model; try again later")
            self._waiting += 1
            self._depth.set(self._waiting)
        try:
            acquired = self._lock.acquire(timeout=max(timeout_s, 0.0))
        finally:
            with self._count_lock:
                self._waiting -= 1
                self._depth.set(self._waiting)
        if not acquired:
            raise TimeoutError(f"waited {timeout_s:.1f} s for the model without getting a turn")
        try:
            yield
        finally:
            self._lock.release()
