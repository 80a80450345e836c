"""MicroBatcher: shared batches, wait bound, error fan-out, bounded queue, timeouts, close.

Timing is made deterministic where it matters by holding the worker inside ``fn`` on an Event
(a "gate") while the queue is filled, then releasing it: the next batch is then exactly what was
queued. Only loose bounds are asserted on wall time; the test machine is slow.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from epd.batcher import MicroBatcher, QueueFull


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.002)


class GatedDouble:
    """Batch fn that doubles each item, records every batch, and can be held shut by a gate."""

    def __init__(self, open_: bool = True) -> None:
        self.gate = threading.Event()
        if open_:
            self.gate.set()
        self.entered = threading.Event()
        self.batches: list[list[int]] = []
        self.thread_names: list[str] = []

    def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        self.thread_names.append(threading.current_thread().name)
        self.entered.set()
        assert self.gate.wait(10.0), "test never opened the gate"
        return [2 * x for x in items]


@pytest.fixture
def make_batcher() -> Iterator[Callable[..., MicroBatcher]]:
    made: list[MicroBatcher] = []

    def make(fn: Callable, **kwargs) -> MicroBatcher:
        params = {"max_batch": 4, "max_wait_s": 0.05, "max_queue": 64} | kwargs
        batcher = MicroBatcher(fn, **params)
        batcher.start()
        made.append(batcher)
        return batcher

    yield make
    for batcher in made:
        batcher.close(timeout_s=2.0)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=12) as executor:
        yield executor


def hold_worker(batcher: MicroBatcher, fn: GatedDouble, pool: ThreadPoolExecutor) -> Future:
    """Put one item into ``fn`` and keep it there until ``fn.gate`` opens."""
    blocker = pool.submit(batcher.submit, 100, 10.0)
    assert fn.entered.wait(5.0)
    return blocker


# --- batching --------------------------------------------------------------------------------


def test_items_from_many_threads_share_batches(make_batcher, pool):
    fn = GatedDouble(open_=False)
    depths: list[int] = []
    sizes: list[int] = []
    batcher = make_batcher(fn, max_batch=4, on_batch=sizes.append, on_queue_depth=depths.append, name="enc-batch")
    blocker = hold_worker(batcher, fn, pool)
    futures = [pool.submit(batcher.submit, i, 10.0) for i in range(8)]
    wait_until(lambda: batcher.queue_depth == 8)
    fn.gate.set()
    assert [f.result(10.0) for f in futures] == [2 * i for i in range(8)]
    assert blocker.result(10.0) == 200
    assert sizes == [1, 4, 4]
    assert [len(b) for b in fn.batches] == [1, 4, 4]
    assert sorted(x for b in fn.batches[1:] for x in b) == list(range(8))
    assert depths == [1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 4, 0]
    assert set(fn.thread_names) == {"enc-batch"}


def test_lone_item_runs_after_max_wait(make_batcher):
    fn = GatedDouble()
    batcher = make_batcher(fn, max_batch=8, max_wait_s=0.05)
    start = time.monotonic()
    assert batcher.submit(21, timeout_s=5.0) == 42
    elapsed = time.monotonic() - start
    assert fn.batches == [[21]]
    # It waited for company (it cannot start before max_wait_s), but not indefinitely.
    assert 0.045 <= elapsed < 3.0


def test_full_batch_runs_at_once(make_batcher):
    fn = GatedDouble()
    batcher = make_batcher(fn, max_batch=4, max_wait_s=30.0)
    start = time.monotonic()
    assert batcher.submit_many([1, 2, 3, 4], timeout_s=10.0) == [2, 4, 6, 8]
    assert time.monotonic() - start < 5.0  # far below max_wait_s: fullness, not the timer, ran it
    assert fn.batches == [[1, 2, 3, 4]]


def test_submit_many_splits_at_max_batch_and_keeps_order(make_batcher):
    fn = GatedDouble()
    batcher = make_batcher(fn, max_batch=3, max_wait_s=0.01)
    assert batcher.submit_many(list(range(7)), timeout_s=10.0) == [0, 2, 4, 6, 8, 10, 12]
    assert fn.batches == [[0, 1, 2], [3, 4, 5], [6]]
    assert batcher.submit_many([], timeout_s=1.0) == []


# --- errors ----------------------------------------------------------------------------------


def test_exception_fails_every_caller_of_the_batch(make_batcher, pool):
    error = ValueError("vision tower exploded")
    gate, entered = threading.Event(), threading.Event()
    seen: list[list[int]] = []

    def failing(items: list[int]) -> list[int]:
        seen.append(list(items))
        entered.set()
        gate.wait(10.0)
        raise error

    batcher = make_batcher(failing, max_batch=4)
    first = pool.submit(batcher.submit, 0, 10.0)
    assert entered.wait(5.0)
    others = [pool.submit(batcher.submit, i, 10.0) for i in (1, 2, 3)]
    wait_until(lambda: batcher.queue_depth == 3)
    gate.set()
    for future in [first, *others]:
        assert future.exception(10.0) is error
    assert [len(b) for b in seen] == [1, 3]


def test_wrong_number_of_results_fails_the_batch(make_batcher):
    batcher = make_batcher(lambda items: items[:-1], max_batch=2, max_wait_s=0.01)
    with pytest.raises(ValueError, match="^batch fn returned 1 results for 2 items$"):
        batcher.submit_many([1, 2], timeout_s=5.0)
    # The worker survives a failed batch.
    batcher2 = make_batcher(GatedDouble(), max_batch=2, max_wait_s=0.01)
    assert batcher2.submit(5, timeout_s=5.0) == 10


def test_failing_on_batch_hook_does_not_kill_the_worker(make_batcher):
    def broken_hook(size: int) -> None:
        raise RuntimeError("metrics bug")

    batcher = make_batcher(GatedDouble(), max_wait_s=0.01, on_batch=broken_hook)
    assert batcher.submit(1, timeout_s=5.0) == 2
    assert batcher.submit(2, timeout_s=5.0) == 4


# --- bounded queue and timeouts --------------------------------------------------------------


def test_queue_full_raises_without_enqueueing(make_batcher, pool):
    fn = GatedDouble(open_=False)
    batcher = make_batcher(fn, max_batch=4, max_queue=2)
    blocker = hold_worker(batcher, fn, pool)
    queued = [pool.submit(batcher.submit, i, 10.0) for i in (1, 2)]
    wait_until(lambda: batcher.queue_depth == 2)
    with pytest.raises(QueueFull, match="2 waiting, max_queue=2"):
        batcher.submit(3, timeout_s=1.0)
    assert issubclass(QueueFull, RuntimeError)
    fn.gate.set()
    assert [f.result(10.0) for f in queued] == [2, 4]
    assert blocker.result(10.0) == 200
    assert fn.batches == [[100], [1, 2]]  # 3 never reached fn


def test_submit_many_that_does_not_fit_enqueues_nothing(make_batcher, pool):
    fn = GatedDouble(open_=False)
    batcher = make_batcher(fn, max_queue=3)
    hold_worker(batcher, fn, pool)
    queued = pool.submit(batcher.submit, 1, 10.0)
    wait_until(lambda: batcher.queue_depth == 1)
    with pytest.raises(QueueFull):
        batcher.submit_many([2, 3, 4], timeout_s=1.0)
    assert batcher.queue_depth == 1
    fn.gate.set()
    assert queued.result(10.0) == 2


def test_timed_out_item_is_dropped_from_the_queue(make_batcher, pool):
    fn = GatedDouble(open_=False)
    depths: list[int] = []
    batcher = make_batcher(fn, on_queue_depth=depths.append)
    blocker = hold_worker(batcher, fn, pool)
    with pytest.raises(TimeoutError):
        batcher.submit(7, timeout_s=0.1)
    assert batcher.queue_depth == 0
    assert depths == [1, 0, 1, 0]
    fn.gate.set()
    assert blocker.result(10.0) == 200
    assert batcher.submit(8, timeout_s=5.0) == 16
    assert fn.batches == [[100], [8]]  # fn never saw 7


def test_an_item_whose_caller_left_is_dropped_from_the_queue(make_batcher, pool):
    from epd.rpc_errors import Cancelled

    fn = GatedDouble(open_=False)
    batcher = make_batcher(fn)
    blocker = hold_worker(batcher, fn, pool)
    wanted = threading.Event()
    wanted.set()
    waiting = pool.submit(batcher.submit_many, [7, 9], 10.0, wanted.is_set)
    wait_until(lambda: batcher.queue_depth == 2)
    left_at = time.monotonic()
    wanted.clear()  # the caller goes away
    with pytest.raises(Cancelled, match="went away"):
        waiting.result(10.0)
    assert time.monotonic() - left_at < 2.0  # noticed at the next poll, not at the 10 s timeout
    assert batcher.queue_depth == 0
    fn.gate.set()
    assert blocker.result(10.0) == 200
    assert batcher.submit(8, timeout_s=5.0) == 16
    assert fn.batches == [[100], [8]]  # fn never saw 7 or 9


def test_a_caller_still_there_gets_its_results(make_batcher):
    batcher = make_batcher(GatedDouble())
    assert batcher.submit_many([1, 2], 5.0, lambda: True) == [2, 4]


# --- lifecycle -------------------------------------------------------------------------------


def test_close_fails_pending_items_and_lets_running_batch_finish(make_batcher, pool):
    fn = GatedDouble(open_=False)
    batcher = make_batcher(fn)
    blocker = hold_worker(batcher, fn, pool)
    pending = [pool.submit(batcher.submit, i, 10.0) for i in (1, 2)]
    wait_until(lambda: batcher.queue_depth == 2)
    closer = pool.submit(batcher.close, 10.0)  # joins the worker, which is still held in fn
    for future in pending:
        error = future.exception(5.0)
        assert isinstance(error, RuntimeError)
        assert str(error) == "batcher closed"
    fn.gate.set()
    assert blocker.result(5.0) == 200
    closer.result(5.0)
    with pytest.raises(RuntimeError, match="^batcher closed$"):
        batcher.submit(3, timeout_s=1.0)
    with pytest.raises(RuntimeError, match="^batcher closed$"):
        batcher.start()
    assert fn.batches == [[100]]
    batcher.close()  # twice is fine


def test_invalid_parameters():
    fn = GatedDouble()
    with pytest.raises(ValueError, match="max_batch must be >= 1, got 0"):
        MicroBatcher(fn, max_batch=0, max_wait_s=0.0, max_queue=1)
    with pytest.raises(ValueError, match="max_wait_s must be >= 0, got -1"):
        MicroBatcher(fn, max_batch=1, max_wait_s=-1, max_queue=1)
    with pytest.raises(ValueError, match="max_queue must be >= 1, got 0"):
        MicroBatcher(fn, max_batch=1, max_wait_s=0.0, max_queue=0)
    batcher = MicroBatcher(fn, max_batch=1, max_wait_s=0.0, max_queue=1)
    with pytest.raises(ValueError, match="timeout_s must be > 0, got 0"):
        batcher.submit(1, timeout_s=0)


def test_an_exception_as_a_result_fails_only_its_own_item(make_batcher, pool):
    bad = ValueError("item 2 cannot be processed")
    batcher = make_batcher(lambda items: [bad if x == 2 else 10 * x for x in items], max_batch=4, max_wait_s=0.2)
    futures = [pool.submit(batcher.submit, i, 10.0) for i in range(4)]
    assert futures[2].exception(10.0) is bad
    assert [f.result(10.0) for i, f in enumerate(futures) if i != 2] == [0, 10, 30]
