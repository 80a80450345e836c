"""A thread-safe LRU cache bounded in bytes, with pins.

The encoder's embedding store and the prefill worker's embedding cache hold tensors whose sizes
vary by orders of magnitude (one thumbnail vs. a 4K page), so an entry count alone cannot bound
memory: the budget here is in bytes, with an entry cap only as a guard against millions of tiny
entries. Pins exist because an entry may be leased to a peer mid-transfer; evicting it then would
pull the tensor out from under the transfer. The cache never looks inside values (no torch
import): the caller says how many bytes each one costs.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

_log = logging.getLogger(__name__)


@dataclass
class _Entry(Generic[V]):
    value: V
    nbytes: int


class ByteBudgetLRU(Generic[K, V]):
    """LRU map whose live entries never exceed ``capacity_bytes`` in total nor ``max_entries`` in number.

    Pins are counted per key (two leases on one digest need two unpins). A pinned entry is never
    evicted to make room; ``discard`` still removes it, because an explicit removal is the
    caller's decision. ``on_evict`` runs for capacity evictions only (not for ``discard`` or a
    replacing ``put``, where the caller already has the old value in hand), outside the lock so
    that a slow or re-entrant callback cannot stall or deadlock other threads.
    """

    def __init__(
        self,
        capacity_bytes: int,
        max_entries: int = 100_000,
        on_evict: Callable[[K, V], None] | None = None,
    ) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self._capacity_bytes = capacity_bytes
        self._max_entries = max_entries
        self._on_evict = on_evict
        self._lock = threading.Lock()
        # Order is recency: first = least recently used, last = most recently used.
        self._entries: OrderedDict[K, _Entry[V]] = OrderedDict()
        self._pins: dict[K, int] = {}  # only keys with a count > 0
        self._bytes_used = 0

    # --- reading ------------------------------------------------------------------------------

    def get(self, key: K) -> V | None:
        """Return the value and mark it most recently used; None when absent."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry.value

    def get_and_pin(self, key: K) -> V | None:
        """``get`` + ``pin`` under one lock, so nothing can evict the entry between the two."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            self._pins[key] = self._pins.get(key, 0) + 1
            return entry.value

    def __contains__(self, key: object) -> bool:
        # Membership is a probe, not a use: it does not refresh recency.
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def bytes_used(self) -> int:
        with self._lock:
            return self._bytes_used

    @property
    def capacity_bytes(self) -> int:
        return self._capacity_bytes

    @property
    def max_entries(self) -> int:
        return self._max_entries

    def pin_count(self, key: K) -> int:
        """How many pins ``key`` holds (0 for unpinned or absent keys)."""
        with self._lock:
            return self._pins.get(key, 0)

    # --- writing ------------------------------------------------------------------------------

    def put(self, key: K, value: V, nbytes: int, pin: bool = False) -> bool:
        """Store ``value`` (replacing any entry for ``key``), evicting LRU unpinned entries to fit.

        All or nothing: when the item cannot fit even after evicting every other unpinned entry
        (it is larger than the budget, or the rest is pinned), nothing is evicted, any old entry
        for ``key`` stays as it was, and the result is False. A replaced entry keeps its pins:
        they protect the key's slot, which the holders still expect to find. `pin`: also pin it,
        under the same lock (nothing can evict it between the two).
        """
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        with self._lock:
            victims = self._victims_for(key, nbytes)
            if victims is None:
                return False
            evicted = [(k, self._remove_locked(k)) for k in victims]
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes_used -= old.nbytes
            self._entries[key] = _Entry(value, nbytes)
            self._bytes_used += nbytes
            if pin:
                self._pins[key] = self._pins.get(key, 0) + 1
        self._notify_evicted(evicted)
        return True

    def pin(self, key: K) -> bool:
        """Protect ``key`` from eviction; False (and no pin) when the key is absent."""
        with self._lock:
            if key not in self._entries:
                return False
            self._pins[key] = self._pins.get(key, 0) + 1
            return True

    def unpin(self, key: K) -> None:
        """Release one pin. Unknown keys and unpinned keys are ignored, so a late or duplicate
        release (a lease reaped by TTL, then acked) cannot raise in a cleanup path."""
        with self._lock:
            count = self._pins.get(key, 0)
            if count <= 1:
                self._pins.pop(key, None)
            else:
                self._pins[key] = count - 1

    def discard(self, key: K) -> V | None:
        """Remove ``key`` whether pinned or not and return its value (None when absent)."""
        with self._lock:
            if key not in self._entries:
                return None
            return self._remove_locked(key)

    # --- internals ----------------------------------------------------------------------------

    def _victims_for(self, key: K, nbytes: int) -> list[K] | None:
        """Keys to evict, oldest first, so that ``key`` fits with ``nbytes``; None if it cannot fit."""
        old = self._entries.get(key)
        bytes_after = self._bytes_used + nbytes - (old.nbytes if old is not None else 0)
        count_after = len(self._entries) + (0 if old is not None else 1)
        victims: list[K] = []
        for candidate, entry in self._entries.items():
            if bytes_after <= self._capacity_bytes and count_after <= self._max_entries:
                return victims
            if candidate == key or candidate in self._pins:
                continue
            victims.append(candidate)
            bytes_after -= entry.nbytes
            count_after -= 1
        if bytes_after <= self._capacity_bytes and count_after <= self._max_entries:
            return victims
        return None

    def _remove_locked(self, key: K) -> V:
        entry = self._entries.pop(key)
        self._pins.pop(key, None)
        self._bytes_used -= entry.nbytes
        return entry.value

    def _notify_evicted(self, evicted: list[tuple[K, V]]) -> None:
        if self._on_evict is None:
            return
        for key, value in evicted:
            try:
                self._on_evict(key, value)
            except Exception:
                # The put already happened; a failing callback must not make it look failed,
                # nor skip the callbacks of the other victims.
                _log.exception("on_evict callback failed for key %r", key)
