"""`epd bench compare`: the same requests against transformers, `epd serve` colocated and disaggregated,
and any other OpenAI-compatible server, in one invocation; medians over runs, one column each.

Run r of every configuration sends the same requests (stream `run{r}` of the same seed), and runs
differ from each other, so a server's embedding cache never sees a measured image twice (except in
the `repeat` workload, whose point that is). Servers start once per configuration; a configuration
that cannot start is a column marked unavailable with the reason, not a failed comparison. Runs
are interleaved across configurations and ratios are taken run by run (see `run_compare`).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from epd.bench.agreement import Agreement, agreement
from epd.bench.load import Background, LoadConfig, Progress, base_url, run_load
from epd.bench.process_cpu import epd_role, per_request, tree_cpu_s
from epd.bench.results import RequestResult
from epd.bench.servers import ServerStartError, epd_serve_command, start_server
from epd.bench.stats import Slo, Summary, median_figures, median_ratios, paired_ratios, summarize
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
    interleave: bool = True  # run r of every configuration before run r + 1 of any (see run_compare)

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
    cpu_per_request: list[dict[str, float]] = field(default_factory=list)  # per run: CPU-s by role (servers we start)

    @property
    def figures(self) -> dict[str, float | None] | None:
        """Medians over runs; None when the configuration did not run."""
        if self.unavailable is not None or not self.summaries:
            return None
        return median_figures(s.figures() for s in self.summaries)

    @property
    def cpu_medians(self) -> dict[str, float]:
        """Each role's CPU-seconds per measured request, the median over runs; empty when not sampled."""
        roles = {role for run in self.cpu_per_request for role in run}
        return {role: statistics.median(run.get(role, 0.0) for run in self.cpu_per_request) for role in sorted(roles)}

    def to_dict(self) -> dict:
        return {"label": self.label, "detail": self.detail, "unavailable": self.unavailable,
                "median": self.figures, "runs": [s.to_dict() for s in self.summaries],
                "cpu_s_per_request": self.cpu_medians or None}


@dataclass
class CompareResult:
    config: CompareConfig
    columns: list[ConfigResult]

    def column(self, label: str) -> ConfigResult | None:
        return next((c for c in self.columns if c.label == label), None)

    def ratios(self, base: str, figure: str = "output_tok_per_s") -> dict[str, float | None] | None:
        """Each column's `figure` ÷ the `base` column's, paired by run (run r against run r) and the
        median taken over runs; None when the base did not run."""
        by_run = self.ratio_runs(base, figure)
        return None if by_run is None else median_ratios(by_run)

    def ratio_runs(self, base: str, figure: str = "output_tok_per_s") -> dict[str, list[float]] | None:
        """Each column's `figure` ÷ the `base` column's, run by run (what `ratios` takes the median of):
        their spread says how far two columns' medians must lie apart to mean anything on a machine
        whose speed drifts. None when the base did not run."""
        base_col = self.column(base)
        if base_col is None or not base_col.summaries:  # the base was skipped, or unavailable: it never ran
            return None
        base_runs = [s.figures().get(figure) for s in base_col.summaries]
        return {c.label: paired_ratios([s.figures().get(figure) for s in c.summaries], base_runs)
                for c in self.columns}

    def agreements(self, base: str = "hf") -> dict[str, Agreement | None] | None:
        """Each other column's outputs against the `base` column's (see epd.bench.agreement); None when
        the base did not run, and None for a column that did not run."""
        base_col = self.column(base)
        if base_col is None or not base_col.results:
            return None
        return {c.label: agreement(c.results, base_col.results) if c.results else None
                for c in self.columns if c.label != base}

    def to_dict(self) -> dict:
        c = self.config
        agreements = self.agreements() or {}
        by_run = {base: self.ratio_runs(base) for base in RATIO_BASES}
        return {"model_dir": c.model_dir, "workload": c.workload.name, "concurrency": c.concurrency,
                "requests": c.requests, "output_len": c.output_len, "runs": c.runs, "seed": c.seed,
                "background": None if c.background is None else f"{c.background.workload.name}:"
                                                                 f"{c.background.concurrency}",
                "columns": [col.to_dict() for col in self.columns],
                "ratios": {f"output_tok_per_s / {base}": None if runs is None else median_ratios(runs)
                           for base, runs in by_run.items()},
                "ratios_by_run": {f"output_tok_per_s / {base}": runs for base, runs in by_run.items()},
                "same_output_as_hf": {label: None if a is None else a.to_dict() for label, a in agreements.items()}}


def run_compare(config: CompareConfig, columns: list[_Column] | None = None) -> CompareResult:
    """Every configuration not skipped, in table order: hf, colocated, cluster, then each --against.

    Interleaved (the default): every configuration is started first, then run r goes to each of
    them in turn before run r + 1 starts, so a machine whose speed drifts over minutes (shared
    VMs drift by ±30%) slows both sides of each run's ratio alike; odd runs go round in reverse
    order (A B, B A, ...), because of two copies of one server, the one right after `hf` ran
    8-27% slower than the other in three comparisons. Sequential: one configuration
    after another, each server started just before its runs and stopped after them (less memory:
    only one model is loaded at a time).
    """
    plan = [make_requests(config.workload, config.requests, seed=config.seed, stream=f"run{r}")
            for r in range(config.runs)]
    columns = _columns(config) if columns is None else columns
    with contextlib.ExitStack() as stack:
        if config.interleave:
            live = [column for column in columns if column.open(stack)]
            for r, requests in enumerate(plan):
                for column in live if r % 2 == 0 else reversed(live):
                    column.run(r, requests)
        else:
            for column in columns:
                with contextlib.ExitStack() as own:
                    if column.open(own):
                        for r, requests in enumerate(plan):
                            column.run(r, requests)
    return CompareResult(config, [column.result for column in columns])


def _columns(config: CompareConfig) -> list[_Column]:
    columns: list[_Column] = []
    if "hf" not in config.skip:
        columns.append(_HfColumn(config))
    if "colocated" not in config.skip:
        columns.append(_ServerColumn(config, "colocated", ("--colocated", "--dtype", config.dtype,
                                                           *config.colocated_args)))
    if "cluster" not in config.skip:
        columns.append(_ServerColumn(config, "cluster", ("--dtype", config.dtype, *config.serve_args)))
    for url in config.against:
        columns.append(_UrlColumn(config, urlsplit(base_url(url)).netloc or url, url, config.against_model))
    return columns


class _Column:
    """One configuration: `open` makes it ready (False: it is unavailable, and says why), `run` one load."""

    result: ConfigResult

    def open(self, stack: contextlib.ExitStack) -> bool:
        raise NotImplementedError

    def run(self, r: int, requests: list[BenchRequest]) -> None:
        raise NotImplementedError


class _HfColumn(_Column):
    def __init__(self, config: CompareConfig) -> None:
        self.config = config
        no_background = "" if config.background is None else " (no background load)"
        self.result = ConfigResult("hf", f"transformers generate, one request at a time, in process{no_background}: "
                                         f"{config.model_dir} ({config.dtype})")

    def open(self, stack: contextlib.ExitStack) -> bool:
        _log(self.config, f"hf: loading {self.config.model_dir}")
        try:
            from epd.bench.hf_baseline import HfBaseline

            self.baseline = HfBaseline(self.config.model_dir, self.config.dtype)
        except Exception as exc:  # any load failure makes the column unavailable, not the comparison
            self.result.unavailable = f"{type(exc).__name__}: {exc}"
            return False
        stack.callback(self.baseline.close)
        return True

    def run(self, r: int, requests: list[BenchRequest]) -> None:
        c = self.config
        # Warm-up requests before every run, as every server load has (caches, allocator, threads).
        for request in make_requests(c.workload, c.warmup, seed=c.seed, stream=f"warmup-run{r}"):
            self.baseline.generate_one(request, c.output_len)
        progress = Progress(len(requests), quiet=c.quiet, label=f"hf run {r + 1}/{c.runs}")
        results, wall_s = self.baseline.run(requests, c.output_len, progress.tick)
        progress.close()
        reuse = {q.index: q.reuse for q in requests if q.reuse is not None}
        self.result.summaries.append(summarize(results, wall_s, c.slo, reuse))
        self.result.results.append(results)


class _UrlColumn(_Column):
    """A server that is already up: each run is one load against it."""

    def __init__(self, config: CompareConfig, label: str, url: str | None, model: str | None,
                 detail: str | None = None) -> None:
        self.config, self.url, self.model = config, url, model
        self.result = ConfigResult(label, detail or url or "")

    def open(self, stack: contextlib.ExitStack) -> bool:
        problem = _probe(self.url)
        if problem:
            self.result.unavailable = problem
        return problem is None

    def run(self, r: int, requests: list[BenchRequest]) -> None:
        c = self.config
        load = LoadConfig(url=self.url, workload=c.workload, model=self.model, requests=len(requests),
                          concurrency=c.concurrency, output_len=c.output_len, seed=c.seed, timeout_s=c.timeout_s,
                          warmup=c.warmup, background=c.background, stream=f"run{r}", quiet=c.quiet,
                          label=f"{self.result.label} run {r + 1}/{c.runs}")
        result = run_load(load, requests)
        self.result.summaries.append(result.summary(c.slo))
        self.result.results.append(result.results)


class _ServerColumn(_UrlColumn):
    """`epd serve ... extra_args`, started by `open` and stopped when its stack closes (on every path)."""

    def __init__(self, config: CompareConfig, label: str, extra_args: tuple[str, ...]) -> None:
        self.command = epd_serve_command(config.model_dir, extra_args)
        super().__init__(config, label, None, None, detail="epd serve " + " ".join(self.command[4:]))

    def open(self, stack: contextlib.ExitStack) -> bool:
        _log(self.config, f"{self.result.label}: starting {self.result.detail}")
        try:
            server = start_server(self.command, name=f"{self.result.label} (epd serve)",
                                  timeout_s=self.config.start_timeout_s)
        except (ServerStartError, OSError) as exc:
            _log(self.config, f"{self.result.label}: unavailable: {exc}")
            self.result.unavailable = str(exc)
            return False
        stack.enter_context(server)
        self.url, self.pid = server.url, server.proc.pid
        return super().open(stack)

    def run(self, r: int, requests: list[BenchRequest]) -> None:
        """One load, and what each of the server's roles spent on it (warm-up and any background
        load included), where /proc tells."""
        before = tree_cpu_s(self.pid, epd_role)
        super().run(r, requests)
        after = tree_cpu_s(self.pid, epd_role)
        if before is not None and after is not None:
            self.result.cpu_per_request.append(per_request(before, after, len(requests)))


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
