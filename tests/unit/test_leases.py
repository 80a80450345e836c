"""LeaseTable: every lease is freed exactly once, by ack, TTL, lookup of an expired entry or close."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from epd.transfer.leases import LeaseTable, LeaseTableFull


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """Counts on_free calls per payload and reaped totals, to check the exactly-once rule."""

    def __init__(self) -> None:
        self.freed: Counter[object] = Counter()
        self.reaped: list[int] = []

    def on_free(self, payload: object) -> None:
        self.freed[payload] += 1

    def on_reaped(self, count: int) -> None:
        self.reaped.append(count)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


@pytest.fixture
def table(clock: FakeClock, rec: Recorder) -> LeaseTable:
    return LeaseTable(max_entries=3, clock=clock, on_reaped=rec.on_reaped)


def test_issue_returns_distinct_hex_ids_and_get_finds_payload(table):
    ids = [table.issue(f"p{i}", 10.0) for i in range(3)]
    assert len(set(ids)) == 3
    assert all(len(hid) == 32 and int(hid, 16) >= 0 for hid in ids)
    assert [table.get(hid) for hid in ids] == ["p0", "p1", "p2"]
    assert table.get("nope") is None
    assert len(table) == 3


def test_release_frees_once_and_second_release_is_false(table, rec):
    hid = table.issue("a", 10.0, on_free=rec.on_free)
    assert table.release(hid) is True
    assert table.release(hid) is False
    assert table.get(hid) is None
    assert rec.freed == Counter({"a": 1})
    assert rec.reaped == []  # an ack is not a reap
    assert len(table) == 0


def test_reap_frees_only_expired(table, clock, rec):
    short = table.issue("short", 5.0, on_free=rec.on_free)
    long = table.issue("long", 20.0, on_free=rec.on_free)
    clock.now += 4.999
    assert table.reap() == 0
    clock.now += 0.001  # exactly at expiry counts as expired
    assert table.reap() == 1
    assert table.get(short) is None and table.get(long) == "long"
    assert rec.freed == Counter({"short": 1})
    assert rec.reaped == [1]
    assert table.reap() == 0
    assert rec.reaped == [1]  # a reap that frees nothing reports nothing


def test_get_of_expired_entry_frees_it_as_reaped(table, clock, rec):
    hid = table.issue("x", 1.0, on_free=rec.on_free)
    clock.now += 2.0
    assert table.get(hid) is None
    assert len(table) == 0
    assert rec.freed == Counter({"x": 1}) and rec.reaped == [1]
    assert table.reap() == 0 and table.release(hid) is False
    assert rec.freed == Counter({"x": 1})


def test_release_after_expiry_is_false_but_frees(table, clock, rec):
    hid = table.issue("late", 1.0, on_free=rec.on_free)
    clock.now += 1.5
    assert table.release(hid) is False
    assert rec.freed == Counter({"late": 1}) and rec.reaped == [1]
    assert len(table) == 0


def test_full_table_raises_and_keeps_caller_ownership(table, rec):
    for i in range(3):
        table.issue(i, 10.0, on_free=rec.on_free)
    with pytest.raises(LeaseTableFull, match="3 leases are active"):
        table.issue("overflow", 10.0, on_free=rec.on_free)
    assert isinstance(LeaseTableFull("x"), RuntimeError)
    assert len(table) == 3 and rec.freed == Counter()


def test_full_table_reaps_expired_before_refusing(table, clock, rec):
    for i in range(3):
        table.issue(i, 1.0, on_free=rec.on_free)
    clock.now += 1.0
    hid = table.issue("fresh", 10.0, on_free=rec.on_free)
    assert table.get(hid) == "fresh"
    assert rec.freed == Counter({0: 1, 1: 1, 2: 1}) and rec.reaped == [3]


def test_close_frees_everything_once_and_refuses_new(table, rec):
    ids = [table.issue(i, 10.0, on_free=rec.on_free) for i in range(3)]
    table.close()
    table.close()
    assert rec.freed == Counter({0: 1, 1: 1, 2: 1})
    assert rec.reaped == []
    assert len(table) == 0 and all(table.get(hid) is None for hid in ids)
    with pytest.raises(RuntimeError, match="closed"):
        table.issue("after", 10.0)


def test_bad_arguments(clock):
    with pytest.raises(ValueError, match="max_entries"):
        LeaseTable(max_entries=0)
    table = LeaseTable(clock=clock)
    for ttl in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="ttl_s"):
            table.issue("p", ttl)
    assert len(table) == 0


def test_raising_on_free_does_not_stop_the_others(table, rec):
    def explode(payload: object) -> None:
        raise OSError("boom")

    table.issue("bad", 10.0, on_free=explode)
    table.issue("good", 10.0, on_free=rec.on_free)
    table.close()
    assert rec.freed == Counter({"good": 1})


def test_on_free_may_reenter_the_table(clock):
    # Callbacks run outside the lock: one that calls back into the table must not deadlock.
    table = LeaseTable(clock=clock)
    seen: list[int] = []
    table.issue("a", 10.0, on_free=lambda _p: seen.append(len(table)))
    table.close()
    assert seen == [0]


def test_concurrent_release_reap_and_close_free_each_lease_exactly_once(clock, rec):
    table = LeaseTable(max_entries=10_000, clock=clock, on_reaped=rec.on_reaped)
    ids = [table.issue(i, 1.0 if i % 2 else 50.0, on_free=rec.on_free) for i in range(2000)]
    clock.now += 10.0  # odd payloads are now expired
    barrier = threading.Barrier(6)

    def releaser(part: list[str]) -> None:
        barrier.wait(timeout=5)
        for hid in part:
            table.release(hid)

    def reaper() -> None:
        barrier.wait(timeout=5)
        for _ in range(50):
            table.reap()

    threads = [threading.Thread(target=releaser, args=(ids[k::4],)) for k in range(4)]
    threads += [threading.Thread(target=reaper), threading.Thread(target=releaser, args=(ids[::-1],))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    table.close()
    assert not any(thread.is_alive() for thread in threads)
    assert rec.freed == Counter({i: 1 for i in range(2000)})
    assert sum(rec.reaped) == 1000  # every odd (expired) lease counted as reaped, whoever found it
    assert len(table) == 0


def test_leases_are_bounded_by_bytes_too(clock, rec):
    table = LeaseTable(max_entries=100, max_bytes=1000, clock=clock)
    first = table.issue("a", 10.0, rec.on_free, nbytes=600)
    with pytest.raises(LeaseTableFull, match="max_bytes=1000"):
        table.issue("b", 10.0, rec.on_free, nbytes=500)
    assert table.bytes_held == 600 and len(table) == 1  # the refused one holds nothing
    assert table.release(first)
    table.issue("b", 10.0, rec.on_free, nbytes=500)
    clock.now += 11  # expired leases make room: they are reaped before refusing
    table.issue("c", 10.0, rec.on_free, nbytes=900)
    assert table.bytes_held == 900
