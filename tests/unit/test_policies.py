"""Routing policies: exact turn order, least-loaded choice, stable bounded-load affinity."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass

import pytest

from router.policies import (
    AffinityByKey,
    LeastOutstanding,
    NoWorkerAvailable,
    RoundRobin,
    make_policy,
    rendezvous_order,
    rendezvous_score,
)


@dataclass
class Worker:
    address: str
    outstanding: int = 0
    outstanding_tokens: int = 0


def workers(*loads: int) -> list[Worker]:
    return [Worker(f"10.0.0.{i}:50051", outstanding=load) for i, load in enumerate(loads)]


def addresses(picked: list[Worker]) -> list[str]:
    return [w.address.split(":")[0] for w in picked]


KEYS = [f"sha256:{i:064x}" for i in range(3000)]


# --- round robin -----------------------------------------------------------------------------


def test_round_robin_cycles_exactly_and_ignores_load_and_key():
    pool = workers(9, 0, 5)
    policy = RoundRobin()
    picked = [policy.pick(pool, key="same") for _ in range(7)]
    assert addresses(picked) == ["10.0.0.0", "10.0.0.1", "10.0.0.2"] * 2 + ["10.0.0.0"]


def test_round_robin_counter_survives_concurrent_callers():
    pool = workers(0, 0, 0, 0)
    policy = RoundRobin()
    counts: Counter[str] = Counter()
    lock = threading.Lock()

    def caller() -> None:
        local = Counter(policy.pick(pool).address for _ in range(1000))
        with lock:
            counts.update(local)

    threads = [threading.Thread(target=caller) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # 8000 turns, none lost or repeated: exactly 2000 each.
    assert sorted(counts.values()) == [2000, 2000, 2000, 2000]


# --- least outstanding -----------------------------------------------------------------------


def test_least_outstanding_picks_the_minimum():
    pool = workers(3, 1, 2)
    policy = LeastOutstanding()
    assert [policy.pick(pool).address for _ in range(3)] == [pool[1].address] * 3


def test_least_outstanding_rotates_ties():
    pool = workers(1, 0, 4, 0, 0)
    policy = LeastOutstanding()
    picked = [policy.pick(pool) for _ in range(6)]
    assert addresses(picked) == ["10.0.0.1", "10.0.0.3", "10.0.0.4"] * 2


def test_least_outstanding_follows_load_as_it_changes():
    pool = workers(0, 0)
    policy = LeastOutstanding()
    for _ in range(6):
        policy.pick(pool).outstanding += 1
    assert [w.outstanding for w in pool] == [3, 3]


def test_least_outstanding_tokens_uses_token_load():
    pool = [Worker("a", outstanding=0, outstanding_tokens=900), Worker("b", outstanding=5, outstanding_tokens=100)]
    assert LeastOutstanding(tokens=True).pick(pool).address == "b"
    assert LeastOutstanding().pick(pool).address == "a"


# --- affinity --------------------------------------------------------------------------------


def test_affinity_is_stable_for_a_key_and_ignores_list_order():
    pool = workers(0, 0, 0, 0)
    policy = AffinityByKey()
    for key in KEYS[:50]:
        first = policy.pick(pool, key=key).address
        assert policy.pick(pool, key=key).address == first
        assert policy.pick(list(reversed(pool)), key=key).address == first
        assert AffinityByKey().pick(pool, key=key).address == first  # no per-instance state


def test_affinity_is_stable_across_processes():
    # Pinned values from a reference run: hash() is salted per process, so with it these would
    # change from run to run (and two router replicas would disagree on where a key lives).
    assert rendezvous_score("cat.png", "10.0.0.0:50051") == 1214214104446796096
    pool = workers(0, 0, 0)
    picked = [AffinityByKey().pick(pool, key=k) for k in ("cat.png", "dog.png", "sha256:00")]
    assert addresses(picked) == ["10.0.0.1", "10.0.0.1", "10.0.0.2"]


def test_affinity_spreads_keys_evenly():
    pool = workers(0, 0, 0)
    policy = AffinityByKey()
    counts = Counter(policy.pick(pool, key=k).address for k in KEYS)
    assert len(counts) == 3
    assert all(800 <= n <= 1200 for n in counts.values()), counts


def test_removing_a_worker_moves_only_its_keys():
    pool = workers(0, 0, 0, 0)
    policy = AffinityByKey()
    before = {k: policy.pick(pool, key=k).address for k in KEYS}
    gone = pool[2].address
    after = {k: policy.pick([w for w in pool if w.address != gone], key=k).address for k in KEYS}
    moved = {k for k in KEYS if before[k] != after[k]}
    assert moved == {k for k in KEYS if before[k] == gone}
    assert len(moved) > 500  # the removed worker did own a real share


def test_adding_a_worker_moves_keys_only_to_it():
    pool = workers(0, 0, 0)
    policy = AffinityByKey()
    before = {k: policy.pick(pool, key=k).address for k in KEYS}
    grown = [*pool, Worker("10.0.0.9:50051")]
    after = {k: policy.pick(grown, key=k).address for k in KEYS}
    assert {after[k] for k in KEYS if before[k] != after[k]} == {"10.0.0.9:50051"}


def test_bounded_load_falls_back_along_the_rendezvous_order():
    pool = workers(0, 0, 0)
    key = KEYS[0]
    first, second, third = rendezvous_order(key, pool)
    policy = AffinityByKey(bound=1.25)
    # mean = 8/3, limit = 1.25 * (8/3 + 1) = 4.58: the preferred worker at 8 is over it.
    first.outstanding = 8
    assert policy.pick(pool, key=key) is second
    # Both preferred ones over: mean = 16/3, limit = 7.9; the third, idle, takes it.
    second.outstanding = 8
    assert policy.pick(pool, key=key) is third
    # Only "exceeds" falls back: mean = 4/3, limit = 1.25 * (4/3 + 1) = 2.92, and 2 is within it.
    first.outstanding, second.outstanding, third.outstanding = 2, 1, 1
    assert policy.pick(pool, key=key) is first
    # A looser bound keeps the key home under more load: limit = 2.0 * (12/3 + 1) = 10 >= 10.
    first.outstanding, second.outstanding, third.outstanding = 10, 1, 1
    assert AffinityByKey(bound=2.0).pick(pool, key=key) is first
    assert AffinityByKey(bound=1.25).pick(pool, key=key) is second


def test_affinity_without_key_uses_least_outstanding():
    pool = workers(2, 0, 1)
    assert AffinityByKey().pick(pool, key=None) is pool[1]


def test_affinity_rejects_bound_below_one():
    with pytest.raises(ValueError, match="bound must be >= 1.0"):
        AffinityByKey(bound=0.9)


# --- common ----------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", [RoundRobin(), LeastOutstanding(), AffinityByKey()])
@pytest.mark.parametrize("key", [None, "k"])
def test_empty_worker_list_raises(policy, key):
    with pytest.raises(NoWorkerAvailable, match="no worker available"):
        policy.pick([], key=key)
    assert issubclass(NoWorkerAvailable, RuntimeError)


def test_make_policy():
    assert type(make_policy("round_robin")) is RoundRobin
    assert type(make_policy("least_outstanding")) is LeastOutstanding
    assert type(make_policy("affinity")) is AffinityByKey
    assert make_policy("round_robin") is not make_policy("round_robin")  # no shared turn counters
    message = "unknown routing policy 'random'; expected one of: affinity, least_outstanding, " + (
        "least_outstanding_tokens, round_robin"
    )
    with pytest.raises(ValueError) as excinfo:
        make_policy("random")
    assert str(excinfo.value) == message
