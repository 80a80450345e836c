"""EngineLoop's paced wait, on a stand-in decode engine (no model): arrivals are admitted during the
wait without ending it; a full batch, a prompt to prefill, idle cores or close() end it."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from epd.engine.loop import EngineLoop
from epd.engine.pacing import DecodePacing

INTERVAL_S = 0.3


class _Engine:
    """What EngineLoop's wait touches of an Engine: a running batch, and admission of imported KV."""

    role = "decode"

    def __init__(self, running: int, max_running: int = 8) -> None:
        self.scheduler = SimpleNamespace(running=[object()] * running, waiting=[],
                                         config=SimpleNamespace(max_running=max_running))
        self.decode_only = True

    def admit_imported(self, seq, kv) -> bool:
        self.scheduler.running.append(seq)
        return True

    def add(self, seq) -> None:  # a sequence with a prompt to prefill
        self.scheduler.waiting.append(seq)
        self.decode_only = False


class _Load:
    """A HostLoad whose other processes are busy (2 cores) until `idle_after_s` have passed."""

    def __init__(self, idle_after_s: float = 1e9) -> None:
        self._idle_at = time.monotonic() + idle_after_s

    def update(self, period_s: float | None = None) -> float:
        return 0.0 if time.monotonic() >= self._idle_at else 2.0


def _loop(engine: _Engine, load: _Load) -> EngineLoop:
    return EngineLoop(engine, pacing=DecodePacing(INTERVAL_S), host_load=load)


def _pace_while(loop: EngineLoop, action, after_s: float = 0.05) -> float:
    """Seconds `loop._pace` waits after a 0-second step, with `action` run on another thread after `after_s`."""
    timer = threading.Timer(after_s, action)
    timer.start()
    started = time.monotonic()
    loop._pace(0.0)
    timer.join()
    return time.monotonic() - started


def test_an_arrival_is_admitted_at_once_but_the_wait_runs_its_interval():
    engine = _Engine(running=2)
    loop = _loop(engine, _Load())
    streams = []
    waited = _pace_while(loop, lambda: streams.append(loop.submit(SimpleNamespace(request_id="b"), kv=[])))
    assert waited >= INTERVAL_S * 0.95
    assert streams[0].admitted and len(engine.scheduler.running) == 3


def test_an_arrival_that_fills_the_batch_ends_the_wait():
    engine = _Engine(running=2, max_running=3)
    loop = _loop(engine, _Load())
    waited = _pace_while(loop, lambda: loop.submit(SimpleNamespace(request_id="b"), kv=[]))
    assert waited < INTERVAL_S * 0.6


def test_a_prompt_to_prefill_ends_the_wait():
    engine = _Engine(running=2)
    loop = _loop(engine, _Load())
    waited = _pace_while(loop, lambda: loop.submit(SimpleNamespace(request_id="p")))
    assert waited < INTERVAL_S * 0.6


def test_the_wait_ends_soon_after_the_other_processes_go_idle():
    loop = _loop(_Engine(running=2), _Load(idle_after_s=0.08))
    waited = _pace_while(loop, lambda: None)
    assert 0.07 < waited < INTERVAL_S * 0.6


def test_close_ends_the_wait():
    loop = _loop(_Engine(running=2), _Load())
    waited = _pace_while(loop, loop.close)
    assert waited < INTERVAL_S * 0.6
