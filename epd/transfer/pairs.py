"""The nccl backend's groups: one two-rank group per (owner, puller) pair, made on demand, cached, dropped on error.

The puller asks the owner for a rendezvous over the gRPC side channel (Transfer.Rendezvous); the
owner opens a TCP store on its own host at a free port and joins as rank 0 on a thread, the puller
joins as rank 1; both keep the group for later transfers. Shapes and dtypes never cross the group:
they travel with the handle. One transfer at a time per pair (NCCL orders operations per
communicator; one lock per pair keeps both sides in step), different pairs in parallel. Any error on
a group drops it on that side, so a dead or confused peer costs one rendezvous, never a stuck group.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from epd.transfer import groups as pg

logger = logging.getLogger(__name__)

MAX_TAG = (1 << 31) - 1  # tags are C ints in torch.distributed
_POLL_S = 0.005


@dataclass
class Pair:
    """One side of a two-rank group. `lock` serializes transfers on it; `store` lives as long as it."""

    group_id: str
    backend: str
    store: object
    group: object = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    next_tag: int = 0
    transfers: int = 0  # started on this group so far

    def take_tags(self, count: int) -> int:
        """The first of `count` fresh tags for one transfer (call under `lock`)."""
        self.transfers += 1
        if self.next_tag + count > MAX_TAG:
            self.next_tag = 0
        first, self.next_tag = self.next_tag, self.next_tag + count
        return first


def wait_all(works: Sequence, timeout_s: float, failed: Callable[[], BaseException | None] = lambda: None) -> None:
    """Wait until every send/recv is done, bounded by `timeout_s` in all.

    The backend's blocking `wait()` runs on a helper thread while this one watches the side channel
    (`failed()`, e.g. the peer's gRPC call having failed): a backend blocked on a peer that died may
    only notice at its own timeout, the side channel knows at once. Raises what `failed()` returns,
    the backend's own error, or TimeoutError. A helper left blocked ends at the group's timeout, or
    sooner when the caller drops the group.
    """
    deadline = time.monotonic() + timeout_s
    done = threading.Event()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            for work in works:
                work.wait(pg._timeout(max(deadline - time.monotonic(), 0.001)))
        except BaseException as exc:  # handed to the watching thread
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=wait, name="epd-pair-wait", daemon=True).start()
    while not done.wait(_POLL_S):
        error = failed()
        if error:  # an exception (falsy values mean "not failed")
            raise error
        if time.monotonic() >= deadline:
            raise TimeoutError(f"transfer did not complete in {timeout_s:.1f} s")
    if errors:
        raise errors[0]


def log_backend(backend: str, who: str) -> None:
    if backend == "gloo":
        logger.warning("nccl: no CUDA on both ends, using gloo (%s)", who)


class OwnerPairs:
    """The owner's groups, by group id; bounded (the least recently used beyond `max_pairs` is dropped)."""

    def __init__(self, host: str, timeout_s: float = 30.0, max_pairs: int = 64) -> None:
        self._host = host
        self._timeout_s = timeout_s
        self._max_pairs = max_pairs
        self._pairs: OrderedDict[str, Future] = OrderedDict()  # group_id -> Future[Pair], done once joined
        self._lock = threading.Lock()

    def rendezvous(self, their_backends: Sequence[str]) -> tuple[str, str, int, str, float]:
        """(group_id, store host, store port, backend, timeout_s) for a new pair; ValueError if no backend is shared."""
        backend = pg.choose_backend(list(their_backends))
        if backend is None:
            raise ValueError(f"no group backend in common: the puller has {list(their_backends)}, "
                             f"this owner {pg.local_backends()}")
        log_backend(backend, "owner")
        store = pg.master_store(self._host, self._timeout_s)
        pair = Pair(secrets.token_hex(8), backend, store)
        joined: Future = Future()
        threading.Thread(target=self._join, args=(pair, joined), name=f"epd-pair-{pair.group_id}",
                         daemon=True).start()
        evicted = []
        with self._lock:
            self._pairs[pair.group_id] = joined
            while len(self._pairs) > self._max_pairs:
                evicted.append(self._pairs.popitem(last=False)[1])
        for old in evicted:
            old.add_done_callback(_drop_future)
        return pair.group_id, self._host, store.port, backend, self._timeout_s

    def _join(self, pair: Pair, joined: Future) -> None:
        try:  # blocks until the puller joins, bounded by the timeout
            pair.group = pg.make_group(pair.backend, pair.store, pg.OWNER_RANK, self._timeout_s, host=self._host,
                                       device=_current_device(pair.backend))
        except Exception as exc:
            logger.warning("group %s: the puller never joined (%s)", pair.group_id, exc)
            self.drop(pair.group_id)
            joined.set_exception(exc)
            return
        joined.set_result(pair)

    def get(self, group_id: str) -> Pair | None:
        """The joined pair (waiting for the join, bounded); None when unknown, dropped or never joined."""
        with self._lock:
            joined = self._pairs.get(group_id)
            if joined is not None:
                self._pairs.move_to_end(group_id)
        if joined is None:
            return None
        try:
            return joined.result(timeout=self._timeout_s)
        except Exception:
            return None

    def send(self, pair: Pair, views: Sequence[torch.Tensor], tag: int,
             failed: Callable[[], Exception | None] = lambda: None) -> int:
        """Send each non-empty [nbytes] uint8 view with tags tag, tag+1, …; drops the pair on any error.

        `failed()`: an error once the puller's call is gone (it died or gave up), checked while waiting.
        """
        works, sent = [], 0
        try:
            with pair.lock:
                for i, view in enumerate(views):
                    if view.numel():
                        works.append(pair.group.send([_staged(view, pair.backend)], pg.PULLER_RANK, tag + i))
                        sent += view.numel()
                wait_all(works, self._timeout_s, failed)
        except Exception:
            self.drop(pair.group_id)
            raise
        return sent

    def drop(self, group_id: str) -> None:
        with self._lock:
            joined = self._pairs.pop(group_id, None)
        if joined is not None:
            joined.add_done_callback(_drop_future)

    def close(self) -> None:
        with self._lock:
            pairs = list(self._pairs.values())
            self._pairs.clear()
        for joined in pairs:
            joined.add_done_callback(_drop_future)


class PullerPairs:
    """The puller's groups, by owner address; bounded like OwnerPairs."""

    def __init__(self, max_pairs: int = 64) -> None:
        self._max_pairs = max_pairs
        self._pairs: OrderedDict[str, Pair] = OrderedDict()
        self._lock = threading.Lock()
        self._joining: dict[str, threading.Lock] = {}

    def get(self, owner_address: str, rendezvous, timeout_s: float) -> Pair:
        """The pair with `owner_address`, joining one if there is none.

        `rendezvous(backends, timeout_s)` asks the owner (Transfer.Rendezvous) and returns its response.
        """
        with self._lock:
            pair = self._pairs.get(owner_address)
            if pair is not None:
                self._pairs.move_to_end(owner_address)
                return pair
            joining = self._joining.setdefault(owner_address, threading.Lock())
        with joining:  # one rendezvous per owner at a time; the others then find its pair
            with self._lock:
                pair = self._pairs.get(owner_address)
            if pair is None:
                pair = self._join(owner_address, rendezvous, timeout_s)
        return pair

    def _join(self, owner_address: str, rendezvous, timeout_s: float) -> Pair:
        reply = rendezvous(pg.local_backends(), timeout_s)
        log_backend(reply.backend, "puller")
        store = pg.client_store(reply.store_host, reply.store_port, timeout_s)
        pair = Pair(reply.group_id, reply.backend, store)
        # The group's own op timeout outlives this first fetch's deadline (each wait is bounded by its own).
        pair.group = pg.make_group(reply.backend, store, pg.PULLER_RANK, max(timeout_s, reply.timeout_ms / 1000),
                                   host=local_address_towards(reply.store_host, reply.store_port),
                                   device=_current_device(reply.backend))
        evicted = []
        with self._lock:
            self._pairs[owner_address] = pair
            while len(self._pairs) > self._max_pairs:
                evicted.append(self._pairs.popitem(last=False)[1])
        for old in evicted:
            pg.drop_group(old.group)
        return pair

    def backend(self, owner_address: str) -> str | None:
        with self._lock:
            pair = self._pairs.get(owner_address)
        return None if pair is None else pair.backend

    def drop(self, owner_address: str, pair: Pair) -> None:
        """Forget `pair` (if it is still the one cached for the owner) and tear it down."""
        with self._lock:
            if self._pairs.get(owner_address) is pair:
                del self._pairs[owner_address]
        pg.drop_group(pair.group)

    def close(self) -> None:
        with self._lock:
            pairs = list(self._pairs.values())
            self._pairs.clear()
        for pair in pairs:
            pg.drop_group(pair.group)


def local_address_towards(host: str, port: int) -> str:
    """This host's address on the route to host:port (what the peer can reach us at); no packet is sent."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        return probe.getsockname()[0]


def _current_device(backend: str) -> torch.device | None:
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None


def _staged(view: torch.Tensor, backend: str) -> torch.Tensor:
    """What the backend can send: gloo sends from CPU memory, nccl from the device."""
    return view if backend == "nccl" or view.device.type == "cpu" else view.cpu()


def _drop_future(joined: Future) -> None:
    if joined.exception() is None:
        pg.drop_group(joined.result().group)
