"""Micro-batching: many submitting threads, one worker thread, one call per batch.

On a GPU the vision tower is far cheaper per image when images from different requests go through
it together (on a CPU it is not, and the encoder keeps its batches small there:
`encoder_svc.config.max_batch_images_for`), but each gRPC handler thread holds only its own
request. This collects their items into batches for a single worker thread: a batch runs as soon
as it is full, or ``max_wait_s`` after its first item arrived, whichever is first, so a lone
request pays at most ``max_wait_s`` of extra latency. The queue is bounded so that overload
turns into a fast ``QueueFull`` (RESOURCE_EXHAUSTED on the wire) rather than unbounded memory
and latency.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

_log = logging.getLogger(__name__)
_POLL_S = 0.25  # how often a waiting caller checks the deadline and that it is still wanted


class QueueFull(RuntimeError):
    """The batcher already holds ``max_queue`` waiting items; the caller should shed load."""


class _Pending(Generic[T, R]):
    """One submitted item and the slot its result (or error) is delivered into."""

    __slots__ = ("item", "enqueued_at", "done", "result", "error")

    def __init__(self, item: T, enqueued_at: float) -> None:
        self.item = item
        self.enqueued_at = enqueued_at
        self.done = threading.Event()
        self.result: R | None = None
        self.error: BaseException | None = None

    def resolve(self, result: R) -> None:
        self.result = result
        self.done.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


class MicroBatcher(Generic[T, R]):
    """Batches items from many threads into calls of ``fn(items) -> results`` on one worker thread.

    ``fn`` must return one result per item, in order; a result that is an exception fails only
    its own item (one bad input must not fail the requests it was batched with). If ``fn`` raises,
    or returns the wrong number of results, every item of that batch fails with that exception:
    results cannot be matched to items any more, and a partial answer would be worse than an
    honest error.

    ``on_queue_depth`` is called under the batcher's lock, so successive depths reach a gauge in
    the order they happened; it must be quick and must not call back into the batcher.
    """

    def __init__(
        self,
        fn: Callable[[list[T]], list[R]],
        *,
        max_batch: int,
        max_wait_s: float,
        max_queue: int,
        on_batch: Callable[[int], None] | None = None,
        on_queue_depth: Callable[[int], None] | None = None,
        name: str = "micro-batcher",
        thread_init: Callable[[], None] | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self._fn = fn
        self._max_batch = max_batch
        self._max_wait_s = max_wait_s
        self._max_queue = max_queue
        self._on_batch = on_batch
        self._on_queue_depth = on_queue_depth
        self._thread_init = thread_init  # runs first on the worker thread (e.g. its compute threads)
        self._cond = threading.Condition()
        self._queue: deque[_Pending[T, R]] = deque()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread. Items submitted before this wait in the queue until then."""
        with self._cond:
            if self._closed:
                raise RuntimeError("batcher closed")
        self._thread.start()  # a second start raises RuntimeError from threading itself

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop taking items, fail the waiting ones, and join the worker thread.

        A batch already inside ``fn`` finishes and its callers get their results; only items
        not yet started fail, with ``RuntimeError("batcher closed")``. Safe to call twice.
        """
        with self._cond:
            self._closed = True
            dropped = list(self._queue)
            self._queue.clear()
            if dropped:
                self._report_depth()
            self._cond.notify_all()
        for pending in dropped:
            pending.fail(RuntimeError("batcher closed"))
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def __enter__(self) -> MicroBatcher[T, R]:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def queue_depth(self) -> int:
        """Items waiting for a batch (not counting the batch being run)."""
        with self._cond:
            return len(self._queue)

    # --- submitting ---------------------------------------------------------------------------

    def submit(self, item: T, timeout_s: float) -> R:
        """Run ``item`` in some batch and return its result, or raise TimeoutError after ``timeout_s``."""
        return self.submit_many([item], timeout_s)[0]

    def submit_many(self, items: list[T], timeout_s: float, is_active: Callable[[], bool] | None = None) -> list[R]:
        """Enqueue ``items`` together (so they can share a batch) and return their results in order.

        All or nothing on entry: if they do not all fit in the queue, none is enqueued and
        ``QueueFull`` is raised. On timeout, or once ``is_active()`` turns False (the caller went
        away; looked at every ``_POLL_S``), the items not yet started are taken back out of the
        queue, so ``fn`` never sees work nobody waits for, and ``TimeoutError`` or
        ``epd.rpc_errors.Cancelled`` is raised.
        """
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if not items:
            return []
        deadline = time.monotonic() + timeout_s
        pendings = self._enqueue(items)
        poll_s = _POLL_S if is_active is not None else float("inf")  # nobody to ask: wait to the deadline
        for pending in pendings:
            while not pending.done.wait(min(max(0.0, deadline - time.monotonic()), poll_s)):
                if time.monotonic() >= deadline:
                    self._withdraw(pendings)
                    raise TimeoutError(f"batched item not done after {timeout_s:.3f} s")
                if is_active is not None and not is_active():
                    from epd.rpc_errors import Cancelled  # here: batching alone needs no gRPC import

                    self._withdraw(pendings)
                    raise Cancelled("the caller went away while its items waited for a batch")
        return [self._outcome(pending) for pending in pendings]

    def _enqueue(self, items: list[T]) -> list[_Pending[T, R]]:
        now = time.monotonic()
        pendings: list[_Pending[T, R]] = [_Pending(item, now) for item in items]
        with self._cond:
            if self._closed:
                raise RuntimeError("batcher closed")
            if len(self._queue) + len(pendings) > self._max_queue:
                raise QueueFull(
                    f"batch queue full: {len(self._queue)} waiting, max_queue={self._max_queue}, "
                    f"{len(pendings)} more submitted"
                )
            self._queue.extend(pendings)
            self._report_depth()
            self._cond.notify_all()
        return pendings

    def _withdraw(self, pendings: list[_Pending[T, R]]) -> None:
        """Remove whichever of ``pendings`` are still queued (a started item cannot be recalled)."""
        mine = {id(p) for p in pendings}
        with self._cond:
            kept = deque(p for p in self._queue if id(p) not in mine)
            if len(kept) != len(self._queue):
                self._queue = kept
                self._report_depth()
                # The worker may be timing a batch whose first item just left.
                self._cond.notify_all()

    @staticmethod
    def _outcome(pending: _Pending[T, R]) -> R:
        if pending.error is not None:
            raise pending.error
        return pending.result  # type: ignore[return-value]  # resolved, so set by the worker

    # --- worker thread ------------------------------------------------------------------------

    def _run(self) -> None:
        if self._thread_init is not None:
            self._thread_init()
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            self._execute(batch)

    def _next_batch(self) -> list[_Pending[T, R]] | None:
        """Block until a batch is due (full, or its first item is ``max_wait_s`` old); None once closed."""
        with self._cond:
            while not self._closed:
                if not self._queue:
                    self._cond.wait()
                    continue
                # Re-read the head each time: it may have been withdrawn by a timed-out caller.
                remaining = self._queue[0].enqueued_at + self._max_wait_s - time.monotonic()
                if len(self._queue) < self._max_batch and remaining > 0:
                    self._cond.wait(remaining)
                    continue
                size = min(self._max_batch, len(self._queue))
                batch = [self._queue.popleft() for _ in range(size)]
                self._report_depth()
                return batch
            return None

    def _execute(self, batch: list[_Pending[T, R]]) -> None:
        self._report_batch(len(batch))
        try:
            results = self._fn([pending.item for pending in batch])
            if len(results) != len(batch):
                raise ValueError(f"batch fn returned {len(results)} results for {len(batch)} items")
        except Exception as exc:
            for pending in batch:
                pending.fail(exc)
            return
        for pending, result in zip(batch, results, strict=True):
            if isinstance(result, BaseException):
                pending.fail(result)
            else:
                pending.resolve(result)

    def _report_batch(self, size: int) -> None:
        if self._on_batch is None:
            return
        try:
            self._on_batch(size)
        except Exception:
            # A broken metrics hook must neither fail the batch nor kill the only worker thread.
            _log.exception("on_batch callback failed")

    def _report_depth(self) -> None:
        if self._on_queue_depth is not None:
            self._on_queue_depth(len(self._queue))
