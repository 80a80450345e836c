"""Percentiles, summaries, goodput and medians on exact numbers."""

import pytest

from epd.bench.results import RequestResult
from epd.bench.stats import Distribution, Slo, median_figures, percentile, summarize


def ok(index: int, ttft_s: float, e2e_s: float, tokens: int, itl_s: tuple[float, ...] = ()) -> RequestResult:
    return RequestResult(index, True, 0.0, ttft_s, e2e_s, itl_s, tokens)


def failed(index: int, error: str = "HTTP 503: no decode worker") -> RequestResult:
    return RequestResult(index, False, 0.0, e2e_s=0.01, status=503, error=error)


def test_percentile_interpolates_linearly_between_ranks():
    values = [4.0, 1.0, 3.0, 2.0]  # order does not matter
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == 2.5
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(values, 99) == pytest.approx(3.97)
    assert percentile(values, 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_percentile_rejects_out_of_range():
    with pytest.raises(ValueError, match="percentile"):
        percentile([1.0], 101)


def test_distribution_is_in_milliseconds():
    dist = Distribution.of_seconds([0.001, 0.002, 0.003])
    assert (dist.count, dist.mean, dist.p50) == (3, pytest.approx(2.0), pytest.approx(2.0))
    assert dist.p99 == pytest.approx(2.98)
    assert Distribution.of_seconds([]) is None


def test_tpot_is_decode_time_over_the_tokens_after_the_first():
    assert ok(0, ttft_s=0.1, e2e_s=0.5, tokens=5).tpot_s == pytest.approx(0.1)
    assert ok(0, ttft_s=0.1, e2e_s=0.1, tokens=1).tpot_s is None
    assert failed(0).tpot_s is None


def test_summary_counts_only_successes_in_throughput_and_latency():
    results = [ok(0, 0.1, 0.5, 5, (0.1,) * 4), ok(1, 0.3, 1.1, 5, (0.2,) * 4), failed(2)]
    s = summarize(results, wall_s=2.0)
    assert (s.requests, s.succeeded, s.failures, s.output_tokens) == (3, 2, 1, 10)
    assert s.req_per_s == 1.0
    assert s.output_tok_per_s == 5.0
    assert s.ttft_ms.p50 == pytest.approx(200.0)
    assert s.tpot_ms.mean == pytest.approx(150.0)  # (0.4 / 4 + 0.8 / 4) / 2
    assert s.itl_ms.count == 8
    assert s.e2e_ms.p50 == pytest.approx(800.0)
    assert s.errors == {"HTTP 503: no decode worker": 1}
    assert s.goodput_req_per_s is None  # no SLO asked for


def test_goodput_counts_requests_meeting_every_slo():
    results = [ok(0, 0.1, 0.5, 5), ok(1, 0.3, 0.7, 5), ok(2, 0.1, 2.1, 5), failed(3)]
    # TPOTs: 100, 100, 500 ms. TTFTs: 100, 300, 100 ms.
    s = summarize(results, wall_s=4.0, slo=Slo(ttft_ms=200, tpot_ms=200))
    assert s.goodput_req_per_s == 0.25  # only request 0 meets both
    assert summarize(results, 4.0, Slo(ttft_ms=200)).goodput_req_per_s == 0.5
    assert summarize(results, 4.0, Slo()).goodput_req_per_s == 0.75  # no limits: every success


def test_slo_parse():
    assert Slo.parse("ttft_ms=500, tpot_ms=50") == Slo(ttft_ms=500.0, tpot_ms=50.0)
    assert Slo.parse("e2e_ms=2000") == Slo(e2e_ms=2000.0)
    with pytest.raises(ValueError, match="ttft_ms, tpot_ms, e2e_ms"):
        Slo.parse("latency=5")
    with pytest.raises(ValueError, match="not a number"):
        Slo.parse("ttft_ms=fast")


def test_zero_wall_time_gives_zero_rates_not_a_division_error():
    s = summarize([failed(0)], wall_s=0.0, slo=Slo(ttft_ms=1))
    assert (s.req_per_s, s.output_tok_per_s, s.goodput_req_per_s, s.ttft_ms) == (0.0, 0.0, 0.0, None)


def test_median_figures_skips_missing_values():
    runs = [{"tok": 10.0, "p99": None}, {"tok": 30.0, "p99": 5.0}, {"tok": 20.0, "p99": 7.0}]
    assert median_figures(runs) == {"tok": 20.0, "p99": 6.0}
    assert median_figures([{"x": None}]) == {"x": None}


def test_figures_flatten_every_distribution():
    figures = summarize([ok(0, 0.1, 0.5, 5, (0.1,) * 4)], wall_s=1.0).figures()
    assert figures["output_tok_per_s"] == 5.0
    assert figures["ttft_p50_ms"] == pytest.approx(100.0)
    assert figures["itl_p99_ms"] == pytest.approx(100.0)
    assert figures["failures"] == 0.0


def test_ttft_is_split_into_first_uses_and_reuses():
    from epd.bench.results import RequestResult
    from epd.bench.stats import summarize

    results = [RequestResult(i, True, 0.0, ttft_s=t, e2e_s=1.0, output_tokens=2) for i, t in
               enumerate([1.0, 0.2, 0.4, 3.0])]
    figures = summarize(results, 2.0, reuse={0: False, 1: True, 2: True, 3: False}).figures()
    assert figures["ttft_p50_first_use_ms"] == 2000.0 and figures["ttft_p50_reuse_ms"] == 300.0
    assert figures["reuse_ttft_ratio"] == 0.15
    assert summarize(results, 2.0).figures()["reuse_ttft_ratio"] is None
