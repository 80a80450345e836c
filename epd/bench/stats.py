"""Percentiles, per-run summaries, goodput and medians over runs (pure: numbers in, numbers out)."""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from epd.bench.results import RequestResult

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile with linear interpolation between ranks (numpy's default); None if empty."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class Distribution:
    """A latency distribution in milliseconds."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of_seconds(cls, values_s: Sequence[float]) -> Distribution | None:
        if not values_s:
            return None
        ms = [v * 1000 for v in values_s]
        p50, p90, p99 = (percentile(ms, q) for q in PERCENTILES)
        return cls(len(ms), statistics.fmean(ms), p50, p90, p99)


@dataclass(frozen=True)
class Slo:
    """Per-request service-level objectives in ms; None: not constrained."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    @classmethod
    def parse(cls, text: str) -> Slo:
        """`ttft_ms=500,tpot_ms=50` -> Slo(500.0, 50.0)."""
        values: dict[str, float] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, sep, value = item.partition("=")
            if not sep or name.strip() not in cls.__dataclass_fields__:
                raise ValueError(f"bad SLO {item!r}: expected NAME=MS with NAME one of ttft_ms, tpot_ms, e2e_ms")
            try:
                values[name.strip()] = float(value)
            except ValueError:
                raise ValueError(f"bad SLO {item!r}: {value!r} is not a number") from None
        return cls(**values)

    def met_by(self, result: RequestResult) -> bool:
        """A failed request meets nothing; a one-token answer has no TPOT to miss."""
        if not result.ok:
            return False
        checks = ((self.ttft_ms, result.ttft_s), (self.tpot_ms, result.tpot_s), (self.e2e_ms, result.e2e_s))
        return all(limit is None or value is None or value * 1000 <= limit for limit, value in checks)


@dataclass(frozen=True)
class Summary:
    """One run: counts, throughput over the measured wall time, latency distributions (ms)."""

    requests: int
    succeeded: int
    failures: int
    wall_s: float
    output_tokens: int
    req_per_s: float
    output_tok_per_s: float
    ttft_ms: Distribution | None
    tpot_ms: Distribution | None
    itl_ms: Distribution | None
    e2e_ms: Distribution | None
    goodput_req_per_s: float | None = None  # None: no SLO given
    slo: Slo | None = None
    ttft_first_use_ms: Distribution | None = None  # `repeat`: requests whose image was new (cache misses)
    ttft_reuse_ms: Distribution | None = None  # `repeat`: requests whose image was sent before (hits)
    errors: dict[str, int] = field(default_factory=dict)  # distinct messages, most common first

    def to_dict(self) -> dict:
        return asdict(self)

    def figures(self) -> dict[str, float | None]:
        """Flat numbers, the unit of comparison and of medians over runs."""
        flat: dict[str, float | None] = {
            "output_tok_per_s": self.output_tok_per_s, "req_per_s": self.req_per_s,
            "goodput_req_per_s": self.goodput_req_per_s, "failures": float(self.failures),
            "output_tokens": float(self.output_tokens), "wall_s": self.wall_s,
        }
        for name in ("ttft", "tpot", "itl", "e2e"):
            dist: Distribution | None = getattr(self, f"{name}_ms")
            for stat in ("mean", "p50", "p90", "p99"):
                flat[f"{name}_{stat}_ms"] = None if dist is None else getattr(dist, stat)
        first, reuse = self.ttft_first_use_ms, self.ttft_reuse_ms
        flat["ttft_p50_first_use_ms"] = first.p50 if first else None
        flat["ttft_p50_reuse_ms"] = reuse.p50 if reuse else None
        flat["reuse_ttft_ratio"] = reuse.p50 / first.p50 if first and reuse and first.p50 else None
        return flat


def summarize(results: Sequence[RequestResult], wall_s: float, slo: Slo | None = None,
              reuse: Mapping[int, bool] | None = None) -> Summary:
    """`reuse`: request index -> whether its image was sent before (the `repeat` workload), to split TTFT."""
    ok = [r for r in results if r.ok]
    reuse = reuse or {}
    tokens = sum(r.output_tokens for r in ok)
    per_s = (lambda n: n / wall_s) if wall_s > 0 else (lambda n: 0.0)
    errors = Counter(r.error or "unknown error" for r in results if not r.ok)
    return Summary(
        requests=len(results), succeeded=len(ok), failures=len(results) - len(ok), wall_s=wall_s,
        output_tokens=tokens, req_per_s=per_s(len(ok)), output_tok_per_s=per_s(tokens),
        ttft_ms=Distribution.of_seconds([r.ttft_s for r in ok if r.ttft_s is not None]),
        tpot_ms=Distribution.of_seconds([r.tpot_s for r in ok if r.tpot_s is not None]),
        itl_ms=Distribution.of_seconds([gap for r in ok for gap in r.itl_s]),
        e2e_ms=Distribution.of_seconds([r.e2e_s for r in ok if r.e2e_s is not None]),
        goodput_req_per_s=None if slo is None else per_s(sum(slo.met_by(r) for r in results)),
        slo=slo, errors=dict(errors.most_common(5)),
        ttft_first_use_ms=Distribution.of_seconds([r.ttft_s for r in ok if r.ttft_s is not None
                                                   and reuse.get(r.index) is False]),
        ttft_reuse_ms=Distribution.of_seconds([r.ttft_s for r in ok if r.ttft_s is not None and reuse.get(r.index)]),
    )


def median_figures(runs: Iterable[dict[str, float | None]]) -> dict[str, float | None]:
    """Each figure's median over runs, ignoring runs where it is missing."""
    runs = list(runs)
    names = dict.fromkeys(name for run in runs for name in run)
    medians: dict[str, float | None] = {}
    for name in names:
        values = [run[name] for run in runs if run.get(name) is not None]
        medians[name] = statistics.median(values) if values else None
    return medians


def paired_ratios(values: Sequence[float | None], bases: Sequence[float | None]) -> list[float]:
    """values[r] / bases[r] for the runs r where both exist and the base is not 0, in run order; pure."""
    return [v / b for v, b in zip(values, bases, strict=False) if v is not None and b]


def median_ratios(by_run: Mapping[str, Sequence[float]]) -> dict[str, float | None]:
    """Each column's median over its per-run ratios (`paired_ratios`), None where no run paired; pure."""
    return {label: statistics.median(ratios) if ratios else None for label, ratios in by_run.items()}
