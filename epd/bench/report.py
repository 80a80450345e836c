"""What a person reads (text tables), what a script reads (one JSON object), what a figure shows (CDFs)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from epd.bench.process_cpu import ROLES
from epd.bench.results import RequestResult
from epd.bench.stats import Summary, median_ratios

if TYPE_CHECKING:
    from epd.bench.compare import CompareResult
    from epd.bench.load import LoadResult

_DISTRIBUTIONS = (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("inter-token", "itl_ms"), ("e2e", "e2e_ms"))
# (row title, figure name) of the comparison table, in order.
COMPARE_ROWS = (("output tok/s", "output_tok_per_s"), ("req/s", "req_per_s"),
                ("TTFT p50 (ms)", "ttft_p50_ms"), ("TTFT p99 (ms)", "ttft_p99_ms"), ("TPOT p50 (ms)", "tpot_p50_ms"),
                ("inter-token p50 (ms)", "itl_p50_ms"), ("inter-token p99 (ms)", "itl_p99_ms"),
                ("e2e p50 (ms)", "e2e_p50_ms"), ("failures", "failures"))


def fmt(value: float | None) -> str:
    """Three significant-ish digits: tiny models have sub-millisecond gaps, big ones seconds."""
    if value is None:
        return "-"
    if abs(value) >= 100 or value == int(value):
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def format_run(result: LoadResult, summary: Summary) -> str:
    c = result.config
    mode = f"rate {c.rate:g}/s (Poisson)" if c.rate is not None else f"concurrency {c.concurrency}"
    background = "" if c.background is None else (f", background {c.background.workload.name}:"
                                                  f"{c.background.concurrency} ({len(result.background)} finished)")
    lines = [f"{c.workload.name}: {summary.requests} requests, {mode}, {c.output_len} output tokens{background}",
             f"model {result.model or '(server default)'} at {c.url}",
             f"succeeded {summary.succeeded}/{summary.requests} in {summary.wall_s:.2f} s: "
             f"{fmt(summary.req_per_s)} req/s, {fmt(summary.output_tok_per_s)} output tok/s"]
    if summary.slo is not None:
        lines.append(f"goodput {fmt(summary.goodput_req_per_s)} req/s under {_slo_text(summary)}")
    lines.append(f"{'(ms)':<12}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}")
    for title, name in _DISTRIBUTIONS:
        dist = getattr(summary, name)
        cells = ["-"] * 4 if dist is None else [fmt(dist.mean), fmt(dist.p50), fmt(dist.p90), fmt(dist.p99)]
        lines.append(f"{title:<12}" + "".join(f"{cell:>10}" for cell in cells))
    lines += [f"failed x{count}: {message}" for message, count in summary.errors.items()]
    return "\n".join(lines)


def run_json(result: LoadResult, summary: Summary) -> dict:
    c = result.config
    return {"url": c.url, "model": result.model, "workload": c.workload.name, "requests": c.requests,
            "concurrency": None if c.rate is not None else c.concurrency, "rate": c.rate,
            "output_len": c.output_len, "seed": c.seed,
            "background": None if c.background is None else {"workload": c.background.workload.name,
                                                             "concurrency": c.background.concurrency,
                                                             "finished": len(result.background)},
            "summary": summary.to_dict(), "figures": summary.figures(),
            "results": [{k: v for k, v in r.to_dict().items() if k != "itl_s"} for r in result.results]}


def format_compare(result: CompareResult) -> str:
    c = result.config
    labels = [col.label for col in result.columns]
    width = max([12, *(len(label) + 2 for label in labels)])
    rows = [(title, [fmt((col.figures or {}).get(name)) if col.unavailable is None else "n/a"
                     for col in result.columns]) for title, name in COMPARE_ROWS]
    rows += _cpu_rows(result)
    if c.slo is not None:
        rows.append(("goodput req/s", [fmt((col.figures or {}).get("goodput_req_per_s")) for col in result.columns]))
    if c.workload.name == "repeat":
        for title, name in (("TTFT p50 first use (ms)", "ttft_p50_first_use_ms"),
                            ("TTFT p50 reuse (ms)", "ttft_p50_reuse_ms")):
            rows.append((title, [fmt((col.figures or {}).get(name)) for col in result.columns]))
        rows.append(("TTFT reuse ÷ first use", [_ratio((col.figures or {}).get("reuse_ttft_ratio"))
                                                for col in result.columns]))
    for base in ("hf", "colocated"):
        if result.column(base) is not None:
            by_run = result.ratio_runs(base) or {}  # once: each run's figures are computed from its results
            ratios = median_ratios(by_run)
            rows.append((f"tok/s ÷ {base}", [_ratio(ratios.get(label)) for label in labels]))
            if c.runs > 1:
                rows.append((f"tok/s ÷ {base}, range of runs",
                             ["" if label == base else _range(by_run.get(label)) for label in labels]))
    agreements = result.agreements()
    if agreements is not None:
        rows.append(("same output as hf", ["" if label == "hf" else "n/a" if agreements.get(label) is None
                                           else agreements[label].cell() for label in labels]))
    title_width = max(len(title) for title, _ in rows) + 2
    background = "" if c.background is None else f", background {c.background.workload.name}:{c.background.concurrency}"
    lines = [f"{c.workload.name}: {c.requests} requests, concurrency {c.concurrency}, {c.output_len} output tokens"
             f"{background}; median of {c.runs} run(s)",
             " " * title_width + "".join(f"{label:>{width}}" for label in labels)]
    lines += [f"{title:<{title_width}}" + "".join(f"{cell:>{width}}" for cell in cells) for title, cells in rows]
    lines += [f"  {col.label}: {col.detail}" for col in result.columns]
    lines += [f"  {label} differs from hf first at {a.first_difference}"
              for label, a in (agreements or {}).items() if a is not None and a.first_difference]
    lines += [f"  {col.label} unavailable: {col.unavailable}" for col in result.columns if col.unavailable]
    return "\n".join(lines)


def write_cdf_plot(path: str | Path, series: Mapping[str, Sequence[RequestResult]], title: str = "") -> Path:
    """A 2×2 PNG: empirical CDFs of TTFT, TPOT, inter-token gaps and e2e (ms), one line per series."""
    from matplotlib.figure import Figure  # lazily: matplotlib is the `bench` extra, and slow to import

    figure = Figure(figsize=(10, 7), layout="constrained")
    axes = figure.subplots(2, 2).flatten()
    for ax, (name, values_of) in zip(axes, _PLOTTED, strict=True):
        for label, results in series.items():
            values = sorted(v * 1000 for r in results if r.ok for v in values_of(r))
            if values:
                fractions = [(i + 1) / len(values) for i in range(len(values))]
                ax.plot(values, fractions, label=label, drawstyle="steps-post")
        ax.set(title=name, xlabel="ms", ylabel="fraction of samples", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(loc="lower right", fontsize="small")
    if title:
        figure.suptitle(title)
    path = Path(path)
    figure.savefig(path, format="png", dpi=100)
    return path


_PLOTTED = (("TTFT", lambda r: [r.ttft_s] if r.ttft_s is not None else []),
            ("TPOT", lambda r: [r.tpot_s] if r.tpot_s is not None else []),
            ("inter-token", lambda r: list(r.itl_s)),
            ("e2e", lambda r: [r.e2e_s] if r.e2e_s is not None else []))


def _cpu_rows(result: CompareResult) -> list[tuple[str, list[str]]]:
    """CPU-seconds per request of each role of the servers compare started (blank for other columns),
    and their sum: where the cores went, which throughput alone does not say."""
    medians = [col.cpu_medians for col in result.columns]
    roles = [role for role in ROLES if any(role in m for m in medians)]
    if not roles:
        return []
    rows = [(f"CPU-s/request {role}", [fmt(m.get(role)) if m else "" for m in medians]) for role in roles]
    rows.append(("CPU-s/request, all", [fmt(sum(m.values())) if m else "" for m in medians]))
    return rows


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _range(values: Sequence[float] | None) -> str:
    """`lowest-highest` of a column's per-run ratios: how much of a gap between medians is noise."""
    return "-" if not values else f"{min(values):.2f}-{max(values):.2f}"


def _slo_text(summary: Summary) -> str:
    slo = summary.slo
    parts = [f"{name} <= {value:g}" for name, value in vars(slo).items() if value is not None] if slo else []
    return ", ".join(parts) or "no limits"
