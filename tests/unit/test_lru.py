"""ByteBudgetLRU: eviction by bytes and entries, pins, replacement, callbacks, and a model check."""

from __future__ import annotations

import random
import threading

import pytest

from epd.lru import ByteBudgetLRU


def check_invariants(cache: ByteBudgetLRU, sizes: dict) -> None:
    """The cache's accounting must match what it holds, and stay within its budgets."""
    assert len(cache) == len(sizes)
    assert cache.bytes_used == sum(sizes.values())
    assert cache.bytes_used <= cache.capacity_bytes
    assert len(cache) <= cache.max_entries
    for key in sizes:
        assert key in cache


def make(capacity: int = 100, **kwargs) -> tuple[ByteBudgetLRU[str, str], list[tuple[str, str]]]:
    evicted: list[tuple[str, str]] = []
    cache: ByteBudgetLRU[str, str] = ByteBudgetLRU(capacity, on_evict=lambda k, v: evicted.append((k, v)), **kwargs)
    return cache, evicted


# --- basics ----------------------------------------------------------------------------------


def test_put_get_and_accounting():
    cache, evicted = make()
    assert cache.put("a", "A", 30) is True
    assert cache.put("b", "B", 20) is True
    assert cache.get("a") == "A"
    assert cache.get("missing") is None
    assert (len(cache), cache.bytes_used, cache.capacity_bytes) == (2, 50, 100)
    assert evicted == []


def test_evicts_least_recently_used_until_it_fits():
    cache, evicted = make()
    for key in "abcd":
        cache.put(key, key.upper(), 25)  # exactly full
    assert cache.get("a") == "A"  # now b is the oldest, then c
    assert cache.put("e", "E", 40) is True  # needs 40 free: evicts b and c, not a
    assert evicted == [("b", "B"), ("c", "C")]
    check_invariants(cache, {"a": 25, "d": 25, "e": 40})


def test_contains_does_not_refresh_recency():
    cache, evicted = make()
    cache.put("a", "A", 50)
    cache.put("b", "B", 50)
    assert "a" in cache
    cache.put("c", "C", 50)
    assert evicted == [("a", "A")]


def test_too_large_returns_false_and_keeps_everything():
    cache, evicted = make()
    cache.put("a", "A", 60)
    cache.put("b", "B", 40)
    assert cache.put("huge", "H", 101) is False
    assert "huge" not in cache
    assert evicted == []
    check_invariants(cache, {"a": 60, "b": 40})


def test_exactly_capacity_fits_by_evicting_all():
    cache, evicted = make()
    cache.put("a", "A", 60)
    assert cache.put("full", "F", 100) is True
    assert evicted == [("a", "A")]
    check_invariants(cache, {"full": 100})


def test_replace_updates_bytes_without_eviction_callback():
    cache, evicted = make()
    cache.put("a", "A1", 30)
    cache.put("b", "B", 30)
    assert cache.put("a", "A2", 70) is True  # 30 + 70 = 100: fits once the old "a" is gone
    assert cache.get("a") == "A2"
    assert evicted == []
    check_invariants(cache, {"a": 70, "b": 30})
    assert cache.put("a", "A3", 10) is True
    check_invariants(cache, {"a": 10, "b": 30})


def test_replace_that_cannot_fit_keeps_old_value():
    cache, _ = make()
    cache.put("a", "A1", 30)
    assert cache.put("a", "A2", 150) is False
    assert cache.get("a") == "A1"
    check_invariants(cache, {"a": 30})


def test_negative_nbytes_and_bad_construction_raise():
    cache, _ = make()
    with pytest.raises(ValueError, match="nbytes must be >= 0, got -1"):
        cache.put("a", "A", -1)
    with pytest.raises(ValueError, match="capacity_bytes must be >= 0, got -5"):
        ByteBudgetLRU(-5)
    with pytest.raises(ValueError, match="max_entries must be >= 1, got 0"):
        ByteBudgetLRU(10, max_entries=0)


def test_discard_returns_value_and_frees_bytes():
    cache, evicted = make()
    cache.put("a", "A", 30)
    cache.pin("a")
    assert cache.discard("a") == "A"  # explicit removal wins over pins
    assert cache.discard("a") is None
    assert cache.pin_count("a") == 0
    assert evicted == []
    check_invariants(cache, {})


def test_max_entries_evicts_oldest():
    cache, evicted = make(capacity=1000, max_entries=2)
    cache.put("a", "A", 1)
    cache.put("b", "B", 1)
    cache.put("c", "C", 1)
    assert evicted == [("a", "A")]
    check_invariants(cache, {"b": 1, "c": 1})


# --- pins ------------------------------------------------------------------------------------


def test_pinned_entries_are_skipped_by_eviction():
    cache, evicted = make()
    cache.put("a", "A", 40)
    cache.put("b", "B", 40)
    assert cache.pin("a") is True
    assert cache.put("c", "C", 50) is True  # a is oldest but pinned: b goes
    assert evicted == [("b", "B")]
    check_invariants(cache, {"a": 40, "c": 50})


def test_put_fails_when_everything_else_is_pinned_and_evicts_nothing():
    cache, evicted = make()
    cache.put("a", "A", 40)
    cache.put("b", "B", 30)
    cache.put("c", "C", 30)
    cache.pin("a")
    cache.pin("b")
    # Evicting c alone frees 30, not enough for 50: all or nothing, so c must survive.
    assert cache.put("d", "D", 50) is False
    assert evicted == []
    check_invariants(cache, {"a": 40, "b": 30, "c": 30})


def test_pins_are_counted():
    cache, evicted = make()
    cache.put("a", "A", 60)
    cache.pin("a")
    cache.pin("a")
    cache.unpin("a")
    assert cache.pin_count("a") == 1
    assert cache.put("b", "B", 60) is False  # still pinned once
    cache.unpin("a")
    assert cache.pin_count("a") == 0
    assert cache.put("b", "B", 60) is True
    assert evicted == [("a", "A")]


def test_pin_absent_and_unpin_unknown_or_below_zero():
    cache, _ = make()
    assert cache.pin("nope") is False
    cache.unpin("nope")  # no error
    cache.put("a", "A", 10)
    cache.unpin("a")  # below zero: no-op
    assert cache.pin_count("a") == 0
    cache.pin("a")
    assert cache.pin_count("a") == 1  # the stray unpin did not leave a negative balance


def test_get_and_pin():
    cache, evicted = make()
    assert cache.get_and_pin("a") is None
    assert cache.pin_count("a") == 0
    cache.put("a", "A", 50)
    cache.put("b", "B", 50)
    assert cache.get_and_pin("a") == "A"
    assert cache.pin_count("a") == 1
    cache.put("c", "C", 50)
    assert evicted == [("b", "B")]


def test_replace_keeps_pins():
    cache, _ = make()
    cache.put("a", "A1", 10)
    cache.pin("a")
    cache.put("a", "A2", 20)
    assert cache.pin_count("a") == 1


def test_on_evict_runs_outside_the_lock():
    # A callback that touches the cache would deadlock if it ran under the (non-reentrant) lock.
    seen: list[tuple[str, int]] = []

    def on_evict(key: str, value: str) -> None:
        seen.append((key, len(cache)))

    cache: ByteBudgetLRU[str, str] = ByteBudgetLRU(10, on_evict=on_evict)
    cache.put("a", "A", 10)
    # In a daemon thread so that a deadlock fails this test in seconds instead of hanging the run.
    worker = threading.Thread(target=cache.put, args=("b", "B", 10), daemon=True)
    worker.start()
    worker.join(5.0)
    assert not worker.is_alive()
    assert seen == [("a", 1)]


def test_failing_on_evict_does_not_fail_put():
    calls: list[str] = []

    def boom(key: str, value: str) -> None:
        calls.append(key)
        raise RuntimeError("callback bug")

    cache: ByteBudgetLRU[str, str] = ByteBudgetLRU(10, on_evict=boom)
    cache.put("a", "A", 5)
    cache.put("b", "B", 5)
    assert cache.put("c", "C", 10) is True
    assert calls == ["a", "b"]
    check_invariants(cache, {"c": 10})


# --- model check -----------------------------------------------------------------------------


class ReferenceLRU:
    """The obvious, slow implementation the real one must agree with."""

    def __init__(self, capacity: int, max_entries: int) -> None:
        self.capacity, self.max_entries = capacity, max_entries
        self.order: list[str] = []  # oldest first
        self.sizes: dict[str, int] = {}
        self.pins: dict[str, int] = {}

    def touch(self, key: str) -> None:
        self.order.remove(key)
        self.order.append(key)

    def put(self, key: str, nbytes: int) -> tuple[bool, list[str]]:
        sizes = {k: v for k, v in self.sizes.items() if k != key}
        victims: list[str] = []
        for k in self.order:
            if sum(sizes.values()) + nbytes <= self.capacity and len(sizes) + 1 <= self.max_entries:
                break
            if k != key and self.pins.get(k, 0) == 0:
                victims.append(k)
                del sizes[k]
        if sum(sizes.values()) + nbytes > self.capacity or len(sizes) + 1 > self.max_entries:
            return False, []
        for k in victims:
            self.remove(k)
        if key in self.sizes:
            self.order.remove(key)
        self.order.append(key)
        self.sizes[key] = nbytes
        return True, victims

    def remove(self, key: str) -> None:
        self.order.remove(key)
        del self.sizes[key]
        self.pins.pop(key, None)


def test_randomized_ops_agree_with_reference_model():
    rng = random.Random(1234)
    cache, evicted = make(capacity=200, max_entries=6)
    ref = ReferenceLRU(200, 6)
    keys = [f"k{i}" for i in range(10)]
    for step in range(3000):
        key, op = rng.choice(keys), rng.choice(["put", "put", "get", "pin", "unpin", "discard", "get_and_pin"])
        if op == "put":
            nbytes = rng.choice([0, 5, 20, 50, 90, 199, 200, 201])
            before = len(evicted)
            ok, victims = ref.put(key, nbytes)
            assert cache.put(key, f"{key}@{step}", nbytes) is ok, step
            assert [k for k, _ in evicted[before:]] == victims, step
        elif op in ("get", "get_and_pin"):
            expect_hit = key in ref.sizes
            got = cache.get(key) if op == "get" else cache.get_and_pin(key)
            assert (got is not None) == expect_hit, step
            if expect_hit:
                ref.touch(key)
                if op == "get_and_pin":
                    ref.pins[key] = ref.pins.get(key, 0) + 1
        elif op == "pin":
            assert cache.pin(key) is (key in ref.sizes), step
            if key in ref.sizes:
                ref.pins[key] = ref.pins.get(key, 0) + 1
        elif op == "unpin":
            cache.unpin(key)
            if ref.pins.get(key, 0) > 0:
                ref.pins[key] -= 1
        else:
            assert (cache.discard(key) is not None) == (key in ref.sizes), step
            if key in ref.sizes:
                ref.remove(key)
        check_invariants(cache, ref.sizes)
        assert all(cache.pin_count(k) == ref.pins.get(k, 0) for k in keys), step


def test_concurrent_puts_keep_accounting_exact():
    cache: ByteBudgetLRU[tuple[int, int], int] = ByteBudgetLRU(1000)

    def writer(tid: int) -> None:
        for i in range(2000):
            cache.put((tid, i % 50), i, 7 + (i % 13))
            cache.get((tid, (i * 7) % 50))

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    live = [k for t in range(4) for k in ((t, i) for i in range(50)) if k in cache]
    assert len(live) == len(cache)
    assert cache.bytes_used <= 1000
    # Every live (t, i) was last written with a value whose size we can recompute.
    assert cache.bytes_used == sum(7 + (cache.get(k) % 13) for k in live)


def test_put_can_pin_under_the_same_lock():
    from epd.lru import ByteBudgetLRU

    cache = ByteBudgetLRU(100)
    assert cache.put("a", "A", 60, pin=True)
    assert cache.pin_count("a") == 1
    assert not cache.put("b", "B", 60)  # "a" is pinned: it cannot be evicted to make room
    cache.unpin("a")
    assert cache.put("b", "B", 60) and "a" not in cache
