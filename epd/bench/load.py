"""Load drivers: a closed loop (N in flight) or an open loop (Poisson arrivals), plus a background loop.

Request bodies are built before the clock starts: base64-encoding a 640×480 PNG takes milliseconds
of the same CPUs the server runs on, and would otherwise land inside the measured latencies.
Every wait is bounded: each request by `timeout_s`, the background's shutdown by `_STOP_TIMEOUT_S`.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import httpx

from epd.bench.client import chat_body, send_request
from epd.bench.results import RequestResult
from epd.bench.stats import Slo, Summary, summarize
from epd.bench.workloads import BenchRequest, WorkloadSpec, make_request, make_requests

_STOP_TIMEOUT_S = 10.0
_MODELS_TIMEOUT_S = 10.0
_BACKGROUND_BACKOFF_S = 0.1


@dataclass(frozen=True)
class Background:
    """A second closed loop kept busy while the foreground is measured (e.g. `image-4:2`)."""

    workload: WorkloadSpec
    concurrency: int = 1

    @classmethod
    def parse(cls, text: str, *, input_len: int = 16, pool_size: int = 4) -> Background:
        name, _, count = text.partition(":")
        try:
            concurrency = int(count) if count else 1
        except ValueError:
            raise ValueError(f"--background {text!r}: the concurrency after ':' must be an integer") from None
        if concurrency < 1:
            raise ValueError(f"--background {text!r}: concurrency must be >= 1")
        return cls(WorkloadSpec(name, input_len=input_len, pool_size=pool_size), concurrency)


@dataclass(frozen=True)
class LoadConfig:
    url: str  # the server's base URL, with or without a trailing /v1
    workload: WorkloadSpec
    model: str | None = None  # None: the first id of GET /v1/models (or none sent, if that fails)
    requests: int = 16
    concurrency: int = 16  # closed loop; ignored when `rate` is set
    rate: float | None = None  # open loop: Poisson arrivals per second
    output_len: int = 48
    seed: int = 0
    timeout_s: float = 600.0
    warmup: int = 1
    background: Background | None = None
    stream: str = "measured"  # names the requests (see workloads.py); compare uses one per run
    quiet: bool = False
    label: str = "epd bench"  # the progress line's prefix

    def __post_init__(self) -> None:
        for name in ("requests", "concurrency", "output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"--rate must be > 0, got {self.rate}")
        if self.warmup < 0 or self.timeout_s <= 0:
            raise ValueError("--warmup must be >= 0 and --timeout-s > 0")


@dataclass(frozen=True)
class LoadResult:
    config: LoadConfig
    model: str | None  # the model name actually sent
    results: list[RequestResult]  # measured requests, in request order
    wall_s: float  # first measured send -> last measured completion
    background: list[RequestResult] = field(default_factory=list)  # background requests that finished
    reuse: dict[int, bool] = field(default_factory=dict)  # `repeat`: request index -> image sent before

    def summary(self, slo: Slo | None = None) -> Summary:
        return summarize(self.results, self.wall_s, slo, self.reuse)


def base_url(url: str) -> str:
    """`http://h:p`, `http://h:p/`, `http://h:p/v1` -> `http://h:p`."""
    url = url.rstrip("/")
    return url.removesuffix("/v1")


def poisson_arrivals(rate: float, count: int, seed: int = 0) -> list[float]:
    """Send times (s from the start) of a Poisson process: exponential gaps, the first at 0."""
    rng = random.Random(f"{seed}/arrivals")
    times, now = [], 0.0
    for _ in range(count):
        times.append(now)
        now += rng.expovariate(rate)
    return times


def run_load(config: LoadConfig, requests: list[BenchRequest] | None = None) -> LoadResult:
    """Run one measured load (blocking). `requests` defaults to the config's workload and seed."""
    return asyncio.run(run_load_async(config, requests))


async def run_load_async(config: LoadConfig, requests: list[BenchRequest] | None = None) -> LoadResult:
    if requests is None:
        requests = make_requests(config.workload, config.requests, seed=config.seed, stream=config.stream)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    # trust_env=False: a proxy from the environment must not sit between a benchmark and loopback.
    async with httpx.AsyncClient(timeout=httpx.Timeout(config.timeout_s), limits=limits, trust_env=False) as client:
        model = config.model or await fetch_model_name(client, config.url)
        bodies = [chat_body(r, model, config.output_len) for r in requests]
        chat_url = f"{base_url(config.url)}/v1/chat/completions"

        async def send(i: int) -> RequestResult:
            return await send_request(client, chat_url, bodies[i], index=requests[i].index, timeout_s=config.timeout_s)

        finished: list[RequestResult] = []
        background = _start_background(client, chat_url, model, config, finished)
        try:
            await _warm_up(client, chat_url, model, config)
            progress = Progress(len(requests), quiet=config.quiet, label=config.label)
            started = time.perf_counter()
            if config.rate is None:
                results = await closed_loop(send, len(requests), config.concurrency, progress.tick)
            else:
                arrivals = poisson_arrivals(config.rate, len(requests), config.seed)
                results = await open_loop(send, arrivals, progress.tick)
            wall_s = time.perf_counter() - started
            progress.close()
        finally:
            await _stop(background)
    reuse = {r.index: r.reuse for r in requests if r.reuse is not None}
    return LoadResult(config, model, results, wall_s, finished, reuse)


async def fetch_model_name(client: httpx.AsyncClient, url: str) -> str | None:
    """The first model id the server lists; None when it lists none or cannot say."""
    try:
        reply = await client.get(f"{base_url(url)}/v1/models", timeout=_MODELS_TIMEOUT_S)
        reply.raise_for_status()
        data = reply.json().get("data") or []
        return data[0]["id"] if data else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        return None


async def closed_loop(send: Callable[[int], Awaitable[RequestResult]], count: int, concurrency: int,
                      on_done: Callable[[RequestResult], None] = lambda r: None) -> list[RequestResult]:
    """`concurrency` workers share requests 0..count-1; each sends its next as soon as one ends."""
    results: list[RequestResult | None] = [None] * count
    indices = iter(range(count))  # shared: asyncio runs one worker at a time between awaits

    async def worker() -> None:
        for i in indices:
            results[i] = await send(i)
            on_done(results[i])

    await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))
    return results  # type: ignore[return-value]


async def open_loop(send: Callable[[int], Awaitable[RequestResult]], arrivals: list[float],
                    on_done: Callable[[RequestResult], None] = lambda r: None) -> list[RequestResult]:
    """Request i is sent at `arrivals[i]` seconds, whatever is still in flight."""
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def one(i: int) -> RequestResult:
        result = await send(i)
        on_done(result)
        return result

    tasks = []
    for i, at in enumerate(arrivals):
        await asyncio.sleep(max(0.0, start + at - loop.time()))
        tasks.append(asyncio.create_task(one(i)))
    return list(await asyncio.gather(*tasks))


async def _warm_up(client: httpx.AsyncClient, chat_url: str, model: str | None, config: LoadConfig) -> None:
    """Unmeasured requests, one at a time, of their own stream (so no measured image gets cached)."""
    for request in make_requests(config.workload, config.warmup, seed=config.seed, stream=f"warmup-{config.stream}"):
        result = await send_request(client, chat_url, chat_body(request, model, config.output_len),
                                    index=request.index, timeout_s=config.timeout_s)
        if not result.ok and not config.quiet:
            print(f"epd bench: warm-up request failed: {result.error}", file=sys.stderr)


def _start_background(client: httpx.AsyncClient, chat_url: str, model: str | None, config: LoadConfig,
                      finished: list[RequestResult]) -> list[asyncio.Task]:
    """Started before the warm-up, so the foreground is measured against a background already running."""
    spec = config.background
    if spec is None:
        return []

    async def worker(first: int) -> None:
        index = first
        while True:
            request = make_request(spec.workload, index, seed=config.seed, stream=f"background-{config.stream}")
            body = await asyncio.to_thread(chat_body, request, model, config.output_len)  # keeps the loop free
            result = await send_request(client, chat_url, body, index=index, timeout_s=config.timeout_s)
            finished.append(result)
            index += spec.concurrency
            if not result.ok:  # a server refusing at once (429, 503) must not turn this into a busy loop
                await asyncio.sleep(_BACKGROUND_BACKOFF_S)

    return [asyncio.create_task(worker(i)) for i in range(spec.concurrency)]


async def _stop(tasks: list[asyncio.Task]) -> None:
    """Cancel the background; a cancelled stream closes its connection, so the server cancels too."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=_STOP_TIMEOUT_S)


class Progress:
    """`\\r`-rewritten progress line on stderr, at most ten times a second."""

    def __init__(self, total: int, *, quiet: bool = False, label: str = "epd bench") -> None:
        self.total, self.quiet, self.label = total, quiet, label
        self.done = self.failed = 0
        self.started = self.shown = time.perf_counter()

    def tick(self, result: RequestResult) -> None:
        self.done += 1
        self.failed += not result.ok
        now = time.perf_counter()
        if not self.quiet and (now - self.shown >= 0.1 or self.done == self.total):
            self.shown = now
            sys.stderr.write(f"\r{self.label}: {self.done}/{self.total} requests, {self.failed} failed, "
                             f"{now - self.started:.1f} s")
            sys.stderr.flush()

    def close(self) -> None:
        if not self.quiet and self.done:
            sys.stderr.write("\n")
            sys.stderr.flush()
