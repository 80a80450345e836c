"""`epd bench run` / `epd bench compare`: flags here, work in the modules `run` imports when called.

Only argparse, shlex and sys at import time: `epd.cli` builds every subcommand's parser, and
every worker process parses its flags through it.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from epd.dtypes import DTYPES
from epd.engine_args import add_decode_forward_argument
from epd.kernels import MODES as KERNEL_MODES

WORKLOAD_NAMES = ("text", "image-1", "image-4", "repeat")  # = epd.bench.workloads.WORKLOADS (a test keeps them equal)


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="bench_command", required=True)
    run = commands.add_parser("run", help="load an OpenAI-compatible server and report latencies and throughput")
    run.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000 (or …/v1)")
    run.add_argument("--model", help="model name to send (default: the first id of GET /v1/models)")
    run.add_argument("--workload", choices=WORKLOAD_NAMES, default="image-1")
    run.add_argument("--rate", type=float, help="open loop: Poisson arrivals per second (instead of --concurrency)")
    _add_load_flags(run)
    run.set_defaults(bench_run=_run)

    compare = commands.add_parser("compare", help="the same requests against transformers, epd serve (colocated, "
                                                  "disaggregated) and other servers; one table")
    compare.add_argument("--model", required=True, metavar="DIR", help="checkpoint directory")
    compare.add_argument("--workload", choices=WORKLOAD_NAMES, required=True)
    compare.add_argument("--runs", type=int, default=3, help="load runs per configuration; medians are reported")
    compare.add_argument("--against", action="append", default=[], metavar="URL",
                         help="an already running OpenAI-compatible server (e.g. vLLM); repeatable")
    compare.add_argument("--against-model", help="model name for --against (default: its GET /v1/models)")
    compare.add_argument("--serve-args", default="", help='extra `epd serve` flags for the cluster column, e.g. '
                                                          '"--cpu-affinity auto"')
    compare.add_argument("--colocated-args", default="", help="extra `epd serve --colocated` flags")
    compare.add_argument("--dtype", choices=DTYPES, default="auto",
                         help="model dtype of the hf, colocated and cluster columns (auto: float32 on CPU)")
    compare.add_argument("--skip", default="", help="comma-separated columns to leave out: hf,colocated,cluster")
    compare.add_argument("--start-timeout-s", type=float, default=600.0, help="bound on each server's start")
    compare.add_argument("--sequential", action="store_true",
                         help="one configuration after another (one model loaded at a time) instead of all "
                              "started at once and run r of each before run r + 1 of any")
    _add_load_flags(compare)
    compare.set_defaults(bench_run=_compare)

    decode = commands.add_parser("decode", help="the engine's decode step at a fixed batch, in process, beside "
                                                "the memory-bandwidth bound of the weights it reads")
    decode.add_argument("--model", required=True, metavar="DIR", help="checkpoint directory")
    decode.add_argument("--batch", type=int, default=32)
    decode.add_argument("--context", type=int, default=256, help="prompt tokens per sequence")
    decode.add_argument("--steps", type=int, default=20, help="measured steps (the median is reported)")
    decode.add_argument("--dtype", choices=DTYPES, default="auto")
    decode.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (auto: cuda if available)")
    decode.add_argument("--profile", action="store_true", help="also print where one step's time goes")
    decode.add_argument("--kernels", choices=KERNEL_MODES, default="auto",
                        help="our C++ kernels or torch's operators (as the workers' flag)")
    add_decode_forward_argument(decode)
    decode.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    decode.set_defaults(bench_run=_decode)

    ceiling = commands.add_parser("ceiling", help="the highest cluster / hf throughput ratio this machine allows: "
                                                  "hf's sequential time over the front end's CPU cost")
    ceiling.add_argument("--model", required=True, metavar="DIR", help="checkpoint directory")
    ceiling.add_argument("--workload", choices=WORKLOAD_NAMES, default="image-1")
    ceiling.add_argument("--requests", type=int, default=16)
    ceiling.add_argument("--output-len", type=int, default=48, help="tokens per request")
    ceiling.add_argument("--dtype", choices=DTYPES, default="auto")
    ceiling.add_argument("--seed", type=int, default=0)
    ceiling.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    ceiling.set_defaults(bench_run=_ceiling)

    transfer = commands.add_parser("transfer", help="GB/s of each transfer backend through the project's code, "
                                                    "beside the raw limit of its medium, in one run")
    transfer.add_argument("--backend", default="grpc,shm,nccl", help="comma-separated: grpc,shm,nccl,cuda_ipc")
    transfer.add_argument("--size-mb", type=float, default=64.0, help="payload size in MiB")
    transfer.add_argument("--repeats", type=int, default=5, help="timed transfers per backend (the median is "
                                                                 "reported)")
    transfer.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    transfer.set_defaults(bench_run=_transfer)


def _add_load_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", type=int, default=16, help="closed loop: requests in flight")
    p.add_argument("--requests", type=int, default=16, help="measured requests (per run)")
    p.add_argument("--input-len", type=int, default=16, help="approximate words of text per request")
    p.add_argument("--pool-size", type=int, default=4, help="repeat workload: distinct images shared")
    p.add_argument("--output-len", type=int, default=48, help="tokens per request (max_tokens, ignore_eos)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=600.0, help="bound on each request")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured requests first")
    p.add_argument("--background", metavar="WORKLOAD[:CONCURRENCY]",
                   help="a second closed loop kept running while the measured one runs, e.g. image-4:2")
    p.add_argument("--slo", metavar="ttft_ms=…,tpot_ms=…", help="report goodput: requests/s meeting every limit")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line of stdout")
    p.add_argument("--plot", metavar="PATH.png", help="write latency CDFs (needs matplotlib: the bench extra)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def run(args: argparse.Namespace) -> int:
    try:
        return args.bench_run(args)
    except ValueError as exc:
        print(f"epd bench {args.bench_command}: {exc}", file=sys.stderr)
        return 2


def _decode(args: argparse.Namespace) -> int:
    from epd.bench.decode import format_decode, run_decode_bench

    if args.batch < 1 or args.context < 1 or args.steps < 1:
        raise ValueError("--batch, --context and --steps must be >= 1")
    result, table = run_decode_bench(args.model, args.batch, args.context, args.steps, args.dtype, args.profile,
                                     args.device, kernels=args.kernels,
                                     direct_decode=args.decode_forward == "direct")
    print(format_decode(result))
    if table:
        print(table)
    if args.json:
        print(json.dumps(result.to_dict()))
    return 0


def _ceiling(args: argparse.Namespace) -> int:
    from epd.bench.ceiling import format_ceiling, run_ceiling

    if args.requests < 1 or args.output_len < 1:
        raise ValueError("--requests and --output-len must be >= 1")
    result = run_ceiling(args.model, args.workload, args.requests, args.output_len, args.dtype, args.seed)
    print(format_ceiling(result))
    if args.json:
        print(json.dumps(result.to_dict()))
    return 0


def _transfer(args: argparse.Namespace) -> int:
    from epd.bench.transfer import format_transfer, parse_backends, run_transfer_bench

    figures = run_transfer_bench(parse_backends(args.backend), args.size_mb, args.repeats)
    print(format_transfer(figures, args.size_mb))
    if args.json:
        print(json.dumps({name: f.to_dict() for name, f in figures.items()}))
    return 0


def _common(args: argparse.Namespace) -> dict:
    from epd.bench.load import Background
    from epd.bench.workloads import WorkloadSpec

    return {"workload": WorkloadSpec(args.workload, input_len=args.input_len, pool_size=args.pool_size),
            "concurrency": args.concurrency, "requests": args.requests, "output_len": args.output_len,
            "seed": args.seed, "timeout_s": args.timeout_s, "warmup": args.warmup, "quiet": args.quiet,
            "background": None if not args.background else Background.parse(
                args.background, input_len=args.input_len, pool_size=args.pool_size)}


def _run(args: argparse.Namespace) -> int:
    from epd.bench.load import LoadConfig, run_load
    from epd.bench.report import format_run, run_json, write_cdf_plot
    from epd.bench.stats import Slo

    config = LoadConfig(url=args.url, model=args.model, rate=args.rate, **_common(args))
    slo = Slo.parse(args.slo) if args.slo else None
    result = run_load(config)
    summary = result.summary(slo)
    print(format_run(result, summary))
    if args.plot:
        print(f"wrote {write_cdf_plot(args.plot, {args.workload: result.results}, title=args.url)}")
    if args.json:
        print(json.dumps(run_json(result, summary)))
    return 0 if summary.succeeded else 1


def _compare(args: argparse.Namespace) -> int:
    from epd.bench.compare import CompareConfig, run_compare
    from epd.bench.report import format_compare, write_cdf_plot
    from epd.bench.stats import Slo

    config = CompareConfig(
        model_dir=args.model, runs=args.runs, against=tuple(args.against), against_model=args.against_model,
        serve_args=tuple(shlex.split(args.serve_args)), colocated_args=tuple(shlex.split(args.colocated_args)),
        dtype=args.dtype,
        skip=frozenset(filter(None, (s.strip() for s in args.skip.split(",")))),
        start_timeout_s=args.start_timeout_s, interleave=not args.sequential,
        slo=Slo.parse(args.slo) if args.slo else None, **_common(args))
    result = run_compare(config)
    print(format_compare(result))
    if args.plot:
        series = {col.label: [r for run in col.results for r in run] for col in result.columns if col.results}
        print(f"wrote {write_cdf_plot(args.plot, series, title=f'{args.model} ({args.workload})')}")
    if args.json:
        print(json.dumps(result.to_dict()))
    ran = [col for col in result.columns if col.figures and col.figures.get("req_per_s")]
    return 0 if ran else 1
