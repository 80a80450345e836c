"""Arrival times, the closed and open loop drivers (with a fake send), background and config parsing."""

import asyncio
import statistics

import pytest

from epd.bench.load import Background, LoadConfig, base_url, closed_loop, open_loop, poisson_arrivals
from epd.bench.results import RequestResult
from epd.bench.workloads import WorkloadSpec


def test_poisson_arrivals_are_seeded_start_at_zero_and_increase():
    a = poisson_arrivals(4.0, 50, seed=1)
    assert a == poisson_arrivals(4.0, 50, seed=1)
    assert a != poisson_arrivals(4.0, 50, seed=2)
    assert a[0] == 0.0
    assert all(x < y for x, y in zip(a, a[1:], strict=False))


def test_poisson_gaps_average_one_over_the_rate():
    a = poisson_arrivals(8.0, 20001, seed=3)
    gaps = [y - x for x, y in zip(a, a[1:], strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(1 / 8, rel=0.03)
    assert statistics.pstdev(gaps) == pytest.approx(1 / 8, rel=0.05)  # exponential: sd = mean


class FakeServer:
    """Each request takes `delay` s; tracks how many are in flight at once."""

    def __init__(self, delay: float = 0.01) -> None:
        self.delay, self.in_flight, self.peak, self.sent_at = delay, 0, 0, {}

    async def send(self, i: int) -> RequestResult:
        self.sent_at[i] = asyncio.get_running_loop().time()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        await asyncio.sleep(self.delay)
        self.in_flight -= 1
        return RequestResult(i, True, 0.0, 0.001, self.delay, (), 1)


def test_closed_loop_keeps_exactly_n_in_flight_and_sends_each_request_once():
    server, done = FakeServer(), []
    results = asyncio.run(closed_loop(server.send, 20, 4, done.append))
    assert server.peak == 4
    assert [r.index for r in results] == list(range(20))
    assert sorted(r.index for r in done) == list(range(20))


def test_closed_loop_with_more_workers_than_requests():
    server = FakeServer()
    assert len(asyncio.run(closed_loop(server.send, 3, 16))) == 3
    assert server.peak == 3


def test_open_loop_sends_at_the_arrival_times_regardless_of_what_is_in_flight():
    server = FakeServer(delay=0.2)
    arrivals = [0.0, 0.05, 0.1, 0.15]
    results = asyncio.run(open_loop(server.send, arrivals))
    assert [r.index for r in results] == [0, 1, 2, 3]
    assert server.peak == 4  # none had finished when the last was sent
    start = server.sent_at[0]
    for i, at in enumerate(arrivals):
        assert server.sent_at[i] - start == pytest.approx(at, abs=0.03)


def test_background_parse():
    bg = Background.parse("image-4:2")
    assert (bg.workload.name, bg.concurrency) == ("image-4", 2)
    assert Background.parse("text").concurrency == 1
    with pytest.raises(ValueError, match="integer"):
        Background.parse("text:many")
    with pytest.raises(ValueError, match="unknown workload"):
        Background.parse("video:1")


def test_load_config_validates():
    spec = WorkloadSpec("text")
    with pytest.raises(ValueError, match="--requests"):
        LoadConfig(url="http://x", workload=spec, requests=0)
    with pytest.raises(ValueError, match="--rate"):
        LoadConfig(url="http://x", workload=spec, rate=0)


def test_base_url_accepts_v1_and_trailing_slashes():
    assert base_url("http://h:1") == base_url("http://h:1/") == base_url("http://h:1/v1/") == "http://h:1"
