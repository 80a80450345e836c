"""Leases: every transfer handle owns its bytes for a bounded time, then they are freed.

Pure bookkeeping (no torch, no protobuf) so the rules can be unit-tested with a fake clock:
a handle is freed exactly once, by whichever comes first of the receiver's ack (`release`), its
TTL (`reap`, or a `get` that finds it expired) or shutdown (`close`). The table is bounded, in
entries and in bytes, so a receiver that never acks cannot grow the owner's memory without limit.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

FreeCallback = Callable[[object], None]


class LeaseTableFull(RuntimeError):
    """Raised by `LeaseTable.issue` when `max_entries` unexpired leases are held."""


@dataclass(frozen=True, slots=True)
class _Entry:
    payload: object
    expires_at: float
    on_free: FreeCallback | None
    nbytes: int = 0


class LeaseTable:
    """Thread-safe map handle_id -> payload with a TTL per entry.

    "Free" means: remove the entry and call its `on_free(payload)` exactly once, outside the lock
    (callbacks unlink files and update metrics; they must not run under the table's lock, and they
    may call back into the table). An `on_free` that raises is logged, never propagated, so one
    bad callback cannot leak the other entries of a `reap` or `close`.
    """

    def __init__(
        self,
        *,
        max_entries: int = 4096,
        max_bytes: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_reaped: Callable[[int], None] | None = None,
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self._max_entries = max_entries
        self._max_bytes = max_bytes  # None: bounded by count only
        self._bytes = 0
        self._clock = clock
        self._on_reaped = on_reaped
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._closed = False

    def issue(self, payload: object, ttl_s: float, on_free: FreeCallback | None = None, nbytes: int = 0) -> str:
        """Store `payload` (`nbytes` big) for `ttl_s` seconds; returns a new random hex handle id.

        Raises LeaseTableFull when `max_entries` unexpired entries are held or `nbytes` more would
        pass `max_bytes` (expired ones are reaped first, so only live leases count), RuntimeError
        after `close`. On any raise the payload is
        not stored and `on_free` is not called: the caller still owns it.
        """
        if not ttl_s > 0:
            raise ValueError(f"lease ttl_s must be > 0, got {ttl_s}")
        if len(self) >= self._max_entries or not self._fits(nbytes):
            self.reap()
        with self._lock:
            if self._closed:
                raise RuntimeError("lease table is closed")
            if len(self._entries) >= self._max_entries:
                raise LeaseTableFull(f"{len(self._entries)} leases are active (max_entries={self._max_entries})")
            if not self._fits(nbytes):
                raise LeaseTableFull(f"{self._bytes} bytes are leased; {nbytes} more would pass max_bytes="
                                     f"{self._max_bytes}")
            self._bytes += nbytes
            handle_id = secrets.token_hex(16)
            while handle_id in self._entries:  # 128 random bits: a collision is astronomically rare
                handle_id = secrets.token_hex(16)
            self._entries[handle_id] = _Entry(payload, self._clock() + ttl_s, on_free, nbytes)
        return handle_id

    def _fits(self, nbytes: int) -> bool:
        return self._max_bytes is None or self._bytes + nbytes <= self._max_bytes

    @property
    def bytes_held(self) -> int:
        with self._lock:
            return self._bytes

    def get(self, handle_id: str) -> object | None:
        """The payload of a live lease; None when unknown or expired (an expired one is freed now)."""
        with self._lock:
            entry = self._entries.get(handle_id)
            if entry is None:
                return None
            if self._clock() < entry.expires_at:
                return entry.payload
            del self._entries[handle_id]
        self._free([entry], reaped=True)
        return None

    def release(self, handle_id: str) -> bool:
        """Free a lease now (the receiver's ack); False when unknown or already expired."""
        with self._lock:
            entry = self._entries.pop(handle_id, None)
        if entry is None:
            return False
        expired = self._clock() >= entry.expires_at
        self._free([entry], reaped=expired)
        return not expired

    def reap(self) -> int:
        """Free every expired lease; returns how many were freed."""
        now = self._clock()
        with self._lock:
            expired = [hid for hid, entry in self._entries.items() if now >= entry.expires_at]
            entries = [self._entries.pop(hid) for hid in expired]
        self._free(entries, reaped=True)
        return len(entries)

    def close(self) -> None:
        """Free every lease, expired or not, and refuse new ones. Idempotent."""
        with self._lock:
            self._closed = True
            entries = list(self._entries.values())
            self._entries.clear()
        self._free(entries, reaped=False)

    def __len__(self) -> int:
        """Entries held, including expired ones not yet found by `get` or `reap`."""
        with self._lock:
            return len(self._entries)

    def _free(self, entries: list[_Entry], *, reaped: bool) -> None:
        # Entries were already removed under the lock, so each reaches exactly one caller of _free.
        with self._lock:
            self._bytes -= sum(entry.nbytes for entry in entries)
        for entry in entries:
            if entry.on_free is None:
                continue
            try:
                entry.on_free(entry.payload)
            except Exception:
                logger.exception("on_free callback of a lease failed; continuing with the others")
        if reaped and entries and self._on_reaped is not None:
            self._on_reaped(len(entries))
