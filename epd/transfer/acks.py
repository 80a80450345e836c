"""Acks that do not hold up the fetch they end.

Once a fetch has its tensors they alias nothing of the owner's (a copy, or a private mapping of a
shm segment that outlives the owner's unlink), so the caller need not wait for the owner's answer
to the Release. That answer is slow for exactly the transfers that matter: freeing a 64 MiB shm
segment takes the owner ~5 ms, as long as the whole fetch. So a fetch queues its ack and returns,
and one thread sends the queued acks (a thread of its own rather than a gRPC future per ack: a
future starts a thread each time). The queue is bounded: when it is full the fetching thread sends
its ack itself, so a slow owner slows its pullers rather than piling up acks. `close` gives the
queued ones their chance to land; an ack lost after all only means the owner frees at the TTL.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")
logger = logging.getLogger(__name__)

_STOP = object()


class AckQueue(Generic[Item]):
    """Thread-safe. `send(item)` delivers one ack and never raises (a lost ack is logged by it)."""

    def __init__(self, send: Callable[[Item], object], max_pending: int = 256) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self._send = send
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._thread = threading.Thread(target=self._run, name="epd-transfer-acks", daemon=True)
        self._thread.start()

    def submit(self, item: Item) -> None:
        """Queue `item`'s ack; sent here and now when the queue is full or closed."""
        if not self._thread.is_alive():
            self._send(item)
            return
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._send(item)

    def pending(self) -> int:
        """Acks queued or being sent."""
        return self._queue.unfinished_tasks

    def wait(self, timeout_s: float) -> bool:
        """True once every queued ack has been sent (answered or given up); False after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        done = self._queue.all_tasks_done
        with done:
            while self._queue.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                done.wait(left)
        return True

    def close(self, timeout_s: float) -> bool:
        """Send what is queued (for at most `timeout_s`), then stop the thread; True if nothing was left."""
        drained = self.wait(timeout_s)
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            return False
        self._thread.join(timeout_s)
        return drained

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                self._send(item)
            except Exception:  # a dead ack thread would leave every later ack to the TTL
                logger.exception("sending a transfer ack failed")
            finally:
                self._queue.task_done()
