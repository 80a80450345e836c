"""The engine on a thread of its own, fed by request threads.

Request handlers (gRPC threads) never touch the engine: they put submissions and aborts into a
bounded inbox and read their sequence's outputs from a `Stream`. The loop thread drains the inbox
between steps, steps while there is work, and sleeps on a condition when there is none. A step
that raises fails only the sequences it held (each stream gets the error) and the loop goes on.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass

import torch

from epd import metrics
from epd.engine.engine import Engine, StepOutput
from epd.engine.pacing import DecodePacing
from epd.engine.paged_cache import NamedTensors
from epd.engine.scheduler import QueueFull
from epd.engine.sequence import Finish, Sequence
from epd.rpc_errors import Overloaded
from epd.threads import HostLoad, StepThreads, set_thread_compute, threads_sleep_between_regions

log = logging.getLogger(__name__)

# How often a paced wait looks again at the other processes' load (/proc/stat ticks are 10 ms).
_PACE_RECHECK_S = 0.05


class EngineFull(Overloaded):
    """The engine cannot take the sequence now (queue full, or no blocks for imported KV)."""


class Stream:
    """One sequence's outputs, in order: StepOutput items, then nothing more once one has a finish.

    Holds at most max_tokens + 1 items (one per token, plus an error), so it needs no other bound.
    """

    def __init__(self, seq: Sequence) -> None:
        self.seq = seq
        self._items: queue.SimpleQueue[StepOutput | BaseException] = queue.SimpleQueue()
        # Set once the engine took the sequence (queued or running) or refused it (`_refusal`). The
        # wait reads these, never the queue: taking an output off it to look for a refusal, and putting
        # it back behind the ones queued since, once reversed a stream's tokens 1 and 2 (a CI run of
        # 64 concurrent streams).
        self._decided = threading.Event()
        self._refusal: BaseException | None = None

    def put(self, item: StepOutput | BaseException) -> None:
        self._items.put(item)

    @property
    def admitted(self) -> bool:
        """Whether the engine has taken the sequence."""
        return self._decided.is_set() and self._refusal is None

    def admit(self) -> None:
        self._decided.set()

    def refuse(self, exc: BaseException) -> None:
        """The engine will not take the sequence: `wait_admitted` raises `exc`, and so does `get`."""
        self._refusal = exc
        self._items.put(exc)
        self._decided.set()

    def wait_admitted(self, timeout_s: float) -> None:
        """Return once the engine has taken the sequence; raise what refused it, or TimeoutError."""
        if not self._decided.wait(max(timeout_s, 0.0)):
            raise TimeoutError(f"{self.seq.request_id} not admitted within {timeout_s:.1f} s")
        if self._refusal is not None:
            raise self._refusal

    def get(self, timeout_s: float) -> StepOutput:
        """The next output; raises what the engine reported, or TimeoutError after timeout_s."""
        try:
            item = self._items.get(timeout=max(timeout_s, 0.0))
        except queue.Empty:
            raise TimeoutError(f"no output for {self.seq.request_id} within {timeout_s:.1f} s") from None
        if isinstance(item, BaseException):
            raise item
        return item


@dataclass(frozen=True)
class _Submit:
    stream: Stream
    kv: NamedTensors | None  # imported prompt KV (decode workers), else None


class EngineLoop:
    def __init__(self, engine: Engine, max_inbox: int = 1024, idle_wait_s: float = 0.5,
                 compute_threads: int | None = None, pacing: DecodePacing | None = None,
                 host_load: HostLoad | None = None) -> None:
        self.engine = engine
        self.pacing = pacing  # None: step as soon as there is work
        self._host_load = host_load  # None: one made on the loop thread (from /proc)
        self.compute_threads = compute_threads  # None: torch's default for a new thread
        self.max_inbox = max_inbox
        self.idle_wait_s = idle_wait_s
        self._inbox: deque[_Submit | str] = deque()  # submissions, and request ids to abort
        self._wake = threading.Condition()
        self._streams: dict[str, Stream] = {}  # loop thread only
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=f"epd-{engine.role}-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def submit(self, seq: Sequence, kv: NamedTensors | None = None) -> Stream:
        """Queue a sequence (with its imported KV, on decode workers); EngineFull when the inbox is full."""
        stream = Stream(seq)
        with self._wake:
            if self._stop:
                raise RuntimeError("the engine is shut down")
            if len(self._inbox) >= self.max_inbox:
                raise EngineFull(f"{len(self._inbox)} submissions already wait for the engine")
            self._inbox.append(_Submit(stream, kv))
            self._wake.notify()
        return stream

    def abort(self, request_id: str) -> None:
        """Cancel a sequence wherever it is; its stream ends with a CANCELLED output."""
        with self._wake:
            self._inbox.append(request_id)  # never refused: aborts free resources
            self._wake.notify()

    def free_blocks(self) -> int:
        """Blocks free right now (a racy read, for fast admission checks)."""
        return self.engine.blocks.num_free_blocks

    # --- the loop thread ------------------------------------------------------------------------

    def _run(self) -> None:
        if self.compute_threads is not None:
            set_thread_compute(self.compute_threads)
        threads = self.compute_threads or torch.get_num_threads()
        self._host_load = self._host_load or HostLoad()
        passive = threads_sleep_between_regions(dict(os.environ))
        self.engine.step_threads = StepThreads(threads, passive, self._host_load)
        while True:
            with self._wake:
                while not self._inbox and not self.engine.has_work and not self._stop:
                    self._wake.wait(self.idle_wait_s)
                if self._stop:
                    break
                pending, self._inbox = self._inbox, deque()
            for item in pending:
                self._take(item)
            if self.engine.has_work:
                self._pace(self._step())
            metrics.QUEUE_DEPTH.labels(self.engine.role).set(len(self.engine.scheduler.waiting))
            metrics.RUNNING.labels(self.engine.role).set(len(self.engine.scheduler.running))
        for stream in list(self._streams.values()):
            stream.put(RuntimeError("the engine shut down"))
        self._streams.clear()

    def _take(self, item: _Submit | str) -> None:
        if isinstance(item, str):
            stream = self._streams.pop(item, None)
            if stream is not None:
                self.engine.abort(stream.seq)
                stream.put(StepOutput(stream.seq, -1, Finish.CANCELLED))
            return
        seq = item.stream.seq
        if seq.request_id in self._streams:
            item.stream.refuse(ValueError(f"request {seq.request_id!r} is already in the engine"))
            return
        try:
            if item.kv is None:
                self.engine.add(seq)
            elif not self.engine.admit_imported(seq, item.kv):
                raise EngineFull(f"no free KV blocks for {seq.max_total_tokens} tokens "
                                 f"({self.engine.blocks.num_free_blocks} blocks free)")
        except (QueueFull, EngineFull, ValueError) as exc:
            item.stream.refuse(EngineFull(str(exc)) if isinstance(exc, QueueFull) else exc)
            return
        self._streams[seq.request_id] = item.stream
        item.stream.admit()

    def _pace(self, step_s: float) -> None:
        """Wait after a decode step while other processes keep our CPUs busy (see epd.engine.pacing)."""
        if self.pacing is None:
            return
        scheduler = self.engine.scheduler
        pause = self.pacing.pause_s(step_s, self.engine.decode_only, len(scheduler.running),
                                    scheduler.config.max_running, self._host_load.update())
        if pause <= 0:
            return
        started = time.monotonic()
        deadline = started + pause
        # Submissions and aborts are taken while we wait (a new sequence is admitted at once, so
        # its first token goes out now), but an arrival does not end the wait: under a burst of
        # requests each one would otherwise start a step, and the steps would stay as small and
        # as many as unpaced ones. The wait ends early for close(), a full batch, or a sequence
        # that needs a prompt step (an engine that also prefills).
        while True:
            with self._wake:
                left = deadline - time.monotonic()
                if self._stop or left <= 0:
                    break
                if not self._inbox:
                    self._wake.wait(min(left, _PACE_RECHECK_S))
                pending, self._inbox = self._inbox, deque()
            for item in pending:
                self._take(item)
            if len(scheduler.running) >= scheduler.config.max_running or not self.engine.decode_only:
                break
            # The front end may have just run out of work: then waiting on would only idle the cores.
            if self._host_load.update(period_s=_PACE_RECHECK_S) <= self.pacing.busy_threshold:
                break
        metrics.PACED_SECONDS.labels(self.engine.role).inc(time.monotonic() - started)

    def _step(self) -> float:
        """One engine step, its outputs handed to their streams; returns the seconds it took."""
        started = time.monotonic()
        try:
            outputs = self.engine.step()
        except Exception as exc:  # a bad step must not take the worker down with it
            log.exception("%s engine step failed", self.engine.role)
            for seq in self.engine.fail_running(exc):
                stream = self._streams.pop(seq.request_id, None)
                if stream is not None:
                    stream.put(RuntimeError(f"the engine step failed: {exc}"))
            return time.monotonic() - started
        for out in outputs:
            stream = self._streams.get(out.seq.request_id)
            if stream is None:
                continue
            stream.put(out)
            if out.finish is not None:
                del self._streams[out.seq.request_id]
        took = time.monotonic() - started
        log.debug("%s step: %d outputs in %.1f ms", self.engine.role, len(outputs), took * 1000)
        return took

