"""Routing policies: which worker of a role gets the next request.

Pure functions of what the registry knows about each worker (address and load), so they are
tested without sockets. Three shapes of need:

- ``RoundRobin``: equal workers, equal requests, nothing to exploit.
- ``LeastOutstanding``: requests of very different cost, so the current load matters more than
  fairness of turns (prefill with long vs. short prompts).
- ``AffinityByKey``: the worker may already hold the result (the encoder's embedding store is
  keyed by image digest), so the same key should go to the same worker, unless that worker is
  overloaded, when a cache miss elsewhere beats queueing behind a hot key.

The policies take no locks: the router calls them from one asyncio loop. Their only state is a
turn counter, an ``itertools.count`` whose ``next`` is atomic under the GIL, so even callers on
other threads cannot make it skip or repeat a turn.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar


class WorkerView(Protocol):
    """What a policy may read about a worker (a registry entry satisfies this)."""

    @property
    def address(self) -> str: ...

    @property
    def outstanding(self) -> int:
        """Requests sent to the worker and not yet finished."""
        ...

    @property
    def outstanding_tokens(self) -> int:
        """Prompt + expected output tokens of those requests: a better cost measure for prefill."""
        ...


W = TypeVar("W", bound=WorkerView)


class NoWorkerAvailable(RuntimeError):
    """There is no worker to route to (none registered, or all ejected as unhealthy)."""


class Policy(Protocol):
    def pick(self, workers: Sequence[W], key: str | None = None) -> W: ...


def _require_workers(workers: Sequence[WorkerView], policy: str) -> None:
    if not workers:
        raise NoWorkerAvailable(f"{policy}: no worker available (none registered, or all ejected as unhealthy)")


class RoundRobin:
    """Each worker in turn, ignoring load and key."""

    def __init__(self) -> None:
        self._turn = itertools.count()

    def pick(self, workers: Sequence[W], key: str | None = None) -> W:
        _require_workers(workers, "round_robin")
        return workers[next(self._turn) % len(workers)]


class LeastOutstanding:
    """The worker with the least load; ties go round robin.

    Without the rotation, equally idle workers would always lose the tie to the first one
    listed, and a burst arriving before any load is reported would land on a single worker.
    ``tokens=True`` measures load in outstanding tokens instead of requests.
    """

    def __init__(self, tokens: bool = False) -> None:
        self._tokens = tokens
        self._turn = itertools.count()

    def pick(self, workers: Sequence[W], key: str | None = None) -> W:
        _require_workers(workers, "least_outstanding_tokens" if self._tokens else "least_outstanding")
        load: Callable[[WorkerView], int] = (
            (lambda w: w.outstanding_tokens) if self._tokens else (lambda w: w.outstanding)
        )
        lowest = min(load(w) for w in workers)
        tied = [w for w in workers if load(w) == lowest]
        return tied[next(self._turn) % len(tied)]


def rendezvous_score(key: str, address: str) -> int:
    """The weight of ``address`` for ``key``: a keyed hash, identical in every process.

    ``hash()`` is salted per process, so two router replicas would disagree on where a key
    lives; a cryptographic digest is stable and spreads keys evenly.
    """
    digest = hashlib.blake2b(f"{address}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_order(key: str, workers: Sequence[W]) -> list[W]:
    """Workers from most to least preferred for ``key`` (highest random weight first).

    Each worker's rank depends only on (key, its own address), so adding or removing a worker
    moves only the keys that worker gains or loses. The address breaks (astronomically rare)
    score ties so the order is total.
    """
    return sorted(workers, key=lambda w: (rendezvous_score(key, w.address), w.address), reverse=True)


class AffinityByKey:
    """Rendezvous hashing of the key over worker addresses, with bounded load.

    The preferred worker is skipped while its outstanding exceeds ``bound * (mean + 1)``; the
    ``+ 1`` keeps an idle cluster from bouncing keys off a worker with a single request. The
    next worker in the key's own rendezvous order takes over, so a hot key's overflow also lands
    consistently. With ``bound >= 1`` some worker is always within the bound (the least loaded
    one is at or below the mean), so a pick never fails for load. Without a key there is
    nothing to be affine to, and load decides.
    """

    def __init__(self, bound: float = 1.25) -> None:
        if bound < 1.0:
            raise ValueError(f"bound must be >= 1.0 (below it no worker may qualify), got {bound}")
        self._bound = bound
        self._fallback = LeastOutstanding()

    def pick(self, workers: Sequence[W], key: str | None = None) -> W:
        _require_workers(workers, "affinity")
        if key is None:
            return self._fallback.pick(workers)
        mean = sum(w.outstanding for w in workers) / len(workers)
        limit = self._bound * (mean + 1)
        return next(w for w in rendezvous_order(key, workers) if w.outstanding <= limit)


_POLICIES: dict[str, Callable[[], Policy]] = {
    "affinity": AffinityByKey,
    "least_outstanding": LeastOutstanding,
    "least_outstanding_tokens": lambda: LeastOutstanding(tokens=True),
    "round_robin": RoundRobin,
}


def make_policy(name: str) -> Policy:
    """A fresh policy for a configuration value; unknown names list the valid ones."""
    factory = _POLICIES.get(name)
    if factory is None:
        raise ValueError(f"unknown routing policy {name!r}; expected one of: {', '.join(sorted(_POLICIES))}")
    return factory()
