"""`epd bench compare`: the same requests against transformers, `epd serve` colocated and disaggregated,
and any other OpenAI-compatible server, in one invocation; medians over runs, one column each.

Run r of every configuration sends the same requests (stream `run{r}` of the same seed), and runs
differ from each other, so a server's embedding cache never sees a measured image twice (except in
the `repeat` workload, whose point that is). Servers start once per configuration; a configuration
that cannot start is a column marked unavailable with the reason, not a failed comparison.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from epd.bench.load import Background, LoadConfig, Progress, base_url, run_load
from epd.bench.results import RequestResult
from epd.bench.servers import ServerStartError, epd_serve_command, start_server
from epd.bench.stats import Slo, Summary, median_figures, summarize
from epd.bench.workloads import BenchRequest, WorkloadSpec, make_requests

BUILT_IN = ("hf", "colocated", "cluster")
RATIO_BASES = ("hf", "colocated")


@dataclass(frozen=True)
class CompareConfig:
    model_dir: str
    workload: WorkloadSpec
    concurrency: int = 16
    requests: int = 16
    output_len: int = 48
    runs: int = 3
    seed: int = 0
    timeout_s: float = 600.0
    warmup: int = 1
    background: Background | None = None
    against: tuple[str, ...] = ()  # base URLs of already running servers
    against_model: str | None = None  # None: each server's first GET /v1/models id
    serve_args: tuple[str, ...] = ()  # extra `epd serve` flags for the cluster column
    colocated_args: tuple[str, ...] = ()  # extra flags for the colocated column
    dtype: str = "auto"  # every built-in column runs the model in this dtype
    skip: frozenset[str] = frozenset()
    start_timeout_s: float = 600.0
    slo: Slo | None = None
    quiet: bool = False

    def __post_init__(self) -> None:
        unknown = set(self.skip) - set(BUILT_IN)
        if unknown:
            raise ValueError(f"--skip: unknown {', '.join(sorted(unknown))}; choose from {', '.join(BUILT_IN)}")
        if self.runs < 1:
            raise ValueError(f"--runs must be >= 1, got {self.runs}")


@dataclass
class ConfigResult:
    """One column: a configuration's summaries per run, or why it could not run."""

    label: str
    detail: str  # what ran: a command line, a URL
    summaries: list[Summary] = field(default_factory=list)
    results: list[list[RequestResult]] = field(default_factory=list)  # per run, per request
    unavailable: str | None = None

    @property
    def figures(self) -> dict[str, float | None] | None:
        """Medians over runs; None when the configuration did not run."""
        if self.unavailable is not None or not self.summaries:
            return None
        return median_figures(s.figures() for s in self.summaries)

    def to_dict(self) -> dict:
        return {"label": self.label, "detail": self.detail, "unavailable": self.unavailable,
                "median": self.figures, "runs": [s.to_dict() for s in self.summaries]}


@dataclass
class CompareResult:
    config: CompareConfig
    columns: list[ConfigResult]

    def column(self, label: str) -> ConfigResult | None:
        return next((c for c in self.columns if c.label == label), None)

    def ratios(self, base: str, figure: str = "output_tok_per_s") -> dict[str, float | None] | None:
        """Each column's `figure` ÷ the `base` column's; None when the base did not run."""
        base_col = self.column(base)
        denominator = (base_col.figures or {}).get(figure) if base_col else None
        if not denominator:
            return None
        ratios = {}
        for c in self.columns:
            value = (c.figures or {}).get(figure)
            ratios[c.label] = None if value is None else value / denominator
        return ratios

    def to_dict(self) -> dict:
        c = self.config
        return {"model_dir": c.model_dir, "workload": c.workload.name, "concurrency": c.concurrency,
                "requests": c.requests, "output_len": c.output_len, "runs": c.runs, "seed": c.seed,
                "background": None if c.background is None else f"{c.background.workload.name}:"
                                                                 f"{c.background.concurrency}",
                "columns": [col.to_dict() for col in self.columns],
                "ratios": {f"output_tok_per_s / {base}": self.ratios(base) for base in RATIO_BASES}}


def run_compare(config: CompareConfig) -> CompareResult:
    """Every configuration not skipped, in table order: hf, colocated, cluster, then each --against."""
    plan = [make_requests(config.workload, config.requests, seed=config.seed, stream=f"run{r}")
            for r in range(config.runs)]
    columns = []
    if "hf" not in config.skip:
        columns.append(run_hf_column(config, plan))
    if "colocated" not in config.skip:
        columns.append(run_server_column(config, plan, "colocated",
                                         ("--colocated", "--dtype", config.dtype, *config.colocated_args)))
    if "cluster" not in config.skip:
        columns.append(run_server_column(config, plan, "cluster", ("--dtype", config.dtype, *config.serve_args)))
    for url in config.against:
        columns.append(run_url_column(config, plan, urlsplit(base_url(url)).netloc or url, url,
                                      config.against_model))
    return CompareResult(config, columns)


def run_hf_column(config: CompareConfig, plan: list[list[BenchRequest]]) -> ConfigResult:
    no_background = "" if config.background is None else " (no background load)"
    column = ConfigResult("hf", f"transformers generate, one request at a time, in process{no_background}: "
                                f"{config.model_dir} ({config.dtype})")
    _log(config, f"hf: loading {config.model_dir}")
    try:
        from epd.bench.hf_baseline import HfBaseline

        baseline = HfBaseline(config.model_dir, config.dtype)
    except Exception as exc:  # any load failure makes the column unavailable, not the comparison
        column.unavailable = f"{type(exc).__name__}: {exc}"
        return column
    try:
        for request in make_requests(config.workload, config.warmup, seed=config.seed, stream="warmup-run0"):
            baseline.generate_one(request, config.output_len)
        for r, requests in enumerate(plan):
            progress = Progress(len(requests), quiet=config.quiet, label=f"hf run {r + 1}/{config.runs}")
            results, wall_s = baseline.run(requests, config.output_len, progress.tick)
            progress.close()
            reuse = {r.index: r.reuse for r in requests if r.reuse is not None}
            column.summaries.append(summarize(results, wall_s, config.slo, reuse))
            column.results.append(results)
    finally:
        baseline.close()
    return column


def run_server_column(config: CompareConfig, plan: list[list[BenchRequest]], label: str,
                      extra_args: tuple[str, ...]) -> ConfigResult:
    """Start `epd serve ... extra_args`, run every load against it, stop it (on every path)."""
    command = epd_serve_command(config.model_dir, extra_args)
    detail = "epd serve " + " ".join(command[4:])
    _log(config, f"{label}: starting {detail}")
    try:
        server = start_server(command, name=f"{label} (epd serve)", timeout_s=config.start_timeout_s)
    except (ServerStartError, OSError) as exc:
        _log(config, f"{label}: unavailable: {exc}")
        return ConfigResult(label, detail, unavailable=str(exc))
    with server:
        return run_url_column(config, plan, label, server.url, None, detail=detail)


def run_url_column(config: CompareConfig, plan: list[list[BenchRequest]], label: str, url: str,
                   model: str | None, detail: str | None = None) -> ConfigResult:
    """Every run's load against a server that is already up."""
    column = ConfigResult(label, detail or url)
    problem = _probe(url)
    if problem:
        column.unavailable = problem
        return column
    for r, requests in enumerate(plan):
        load = LoadConfig(url=url, workload=config.workload, model=model, requests=len(requests),
                          concurrency=config.concurrency, output_len=config.output_len, seed=config.seed,
                          timeout_s=config.timeout_s, warmup=config.warmup, background=config.background,
                          stream=f"run{r}", quiet=config.quiet, label=f"{label} run {r + 1}/{config.runs}")
        result = run_load(load, requests)
        column.summaries.append(result.summary(config.slo))
        column.results.append(result.results)
    return column


def _probe(url: str) -> str | None:
    """Why `url` cannot be benchmarked (nothing answers GET /v1/models), or None."""
    try:
        reply = httpx.get(f"{base_url(url)}/v1/models", timeout=10.0, trust_env=False)
    except httpx.HTTPError as exc:
        return f"{url} does not answer: {type(exc).__name__}: {exc}"
    return None if reply.status_code == 200 else f"{url}/v1/models answered HTTP {reply.status_code}"


def _log(config: CompareConfig, message: str) -> None:
    if not config.quiet:
        print(f"epd bench compare: {message}", file=sys.stderr, flush=True)
