"""`epd` command line: one subcommand per job."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from epd.dtypes import DTYPES
from epd.engine_args import add_passed_engine_arguments, passed_engine_args
from epd.transfer_backends import TRANSFER_BACKENDS

# Spelled out (a unit test keeps them equal to epd.tiny.families): importing that module pulls in
# transformers and torchvision, ~8 s, which every worker process would pay just to parse flags.
FAMILY_NAMES = ("kimi_k25", "qwen3_vl_moe")
SIZES = ("tiny", "small")

# The CLI is the composition root: it names the service packages by module path and imports one
# only when its command runs, so `epd` itself never depends on a service at import time.
SERVICE_MODULES = {
    "encoder": ("encoder_svc.main", "run an encoder worker: image processor + vision tower, gRPC Encode"),
    "prefill": ("prefill_svc.main", "run a prefill worker: language model over the prompt, KV handed off"),
    "decode": ("decode_svc.main", "run a decode worker: imports KV, streams tokens"),
    "colocated": ("colocated_svc.main", "run encoder, prefill and decode in one process on one engine (baseline)"),
    "router": ("router.main", "run the router: OpenAI-compatible HTTP gateway + gRPC Router API"),
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in SERVICE_MODULES:  # a server: it freezes its heap once loaded (epd.heap)
        from epd.heap import defer_collection

        defer_collection()
    return args.run(args)


def build_parser() -> argparse.ArgumentParser:
    """Every `epd` command and its flags (also what scripts/gen_config_reference.py documents)."""
    parser = argparse.ArgumentParser(prog="epd", description="EPD cluster: disaggregated multimodal MoE serving")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_make_tiny_model(commands)
    _add_generate(commands)
    _add_serve(commands)
    _add_bench(commands)
    _add_ray(commands)
    for role, module in SERVICE_MODULES.items():
        _add_service(commands, role, module)
    return parser


def _add_make_tiny_model(commands) -> None:
    p = commands.add_parser("make-tiny-model", help="write a randomly drawn checkpoint directory")
    p.add_argument("--family", choices=FAMILY_NAMES, required=True)
    p.add_argument("--size", choices=SIZES, default="tiny")
    p.add_argument("--out", required=True, help="directory to write (created if missing)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=_run_make_tiny_model)


def _run_make_tiny_model(args) -> int:
    from epd.tiny.writer import make_tiny_model

    out = make_tiny_model(args.family, args.size, args.out, seed=args.seed)
    info = json.loads((out / "epd_tiny_model.json").read_text())
    print(f"wrote {args.family} ({args.size}, {info['parameters']:,} parameters) to {out}")
    return 0


def _add_generate(commands) -> None:
    p = commands.add_parser("generate", help="run one request in process: encode -> prefill -> decode")
    p.add_argument("--model", help="checkpoint directory (default: the cached demo checkpoint)")
    p.add_argument("--image", action="append", default=[], metavar="PATH", help="an image file; repeatable")
    p.add_argument("--prompt", required=True, help="the user's text")
    p.add_argument("--system", help="an optional system message")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--json", action="store_true", help='print {"token_ids", "text", "prompt_tokens"} as one line')
    p.set_defaults(run=_run_generate)


def _run_generate(args) -> int:
    from epd.engine.params import SamplingParams
    from epd.images import open_image_file

    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                seed=args.seed, max_tokens=args.max_tokens, ignore_eos=args.ignore_eos)
        images = [open_image_file(path) for path in args.image]
    except ValueError as exc:
        print(f"epd generate: {exc}", file=sys.stderr)
        return 2
    from epd.demo import demo_model_dir
    from epd.engine.pipeline import InProcessPipeline
    from epd.models.errors import ModelLoadError

    try:
        pipeline = InProcessPipeline(args.model or demo_model_dir())
    except (ModelLoadError, ValueError) as exc:
        print(f"epd generate: {exc}", file=sys.stderr)
        return 1
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": [{"type": "image"} for _ in images] + [{"type": "text", "text": args.prompt}]}
    ]
    result = pipeline.chat(messages, images, params)
    if args.json:
        print(json.dumps({"token_ids": result.token_ids, "text": result.text,
                          "prompt_tokens": result.prompt_tokens}))
    else:
        print(result.text)
    return 0


def _add_service(commands, role: str, module_help: tuple[str, str]) -> None:
    import importlib

    module_name, help_text = module_help
    p = commands.add_parser(role, help=help_text)
    module = importlib.import_module(module_name)
    module.add_arguments(p)
    p.set_defaults(run=module.run)


def _add_serve(commands) -> None:
    p = commands.add_parser("serve", help="start router + workers as local processes and serve until Ctrl-C")
    p.add_argument("--model", help="checkpoint directory (default: the cached demo checkpoint)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="router HTTP port (0: pick a free one)")
    p.add_argument("--grpc-port", type=int, default=0, help="router gRPC port (0: pick a free one)")
    p.add_argument("--encoders", type=int, default=1)
    p.add_argument("--prefills", type=int, default=1)
    p.add_argument("--decodes", type=int, default=1)
    p.add_argument("--transfer", choices=TRANSFER_BACKENDS, default="grpc",
                   help="how workers fetch each other's outputs: grpc, shm (same host) or nccl (gloo on CPUs)")
    p.add_argument("--allow-url-host", action="append", default=[], metavar="HOST[:PORT]",
                   help="let image URLs reach this (loopback/private) host; repeatable")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="every worker's weights, activations and KV cache (auto: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--device", default="auto", help="every worker's --device: auto, cpu, cuda or cuda:N")
    p.add_argument("--gpus", metavar="auto|0,1,…",
                   help="GPUs for the workers, round-robin, one CUDA_VISIBLE_DEVICES each (auto: every visible GPU; "
                        "default: workers inherit this process's)")
    p.add_argument("--colocated", action="store_true",
                   help="one worker doing encode, prefill and decode on one engine (the baseline)")
    p.add_argument("--cpu-affinity", metavar="auto|ROLE=CPUS,...",
                   help="pin processes to CPUs: auto gives decode workers cores of their own; "
                        "or e.g. decode=1,encoder=0,prefill=0,router=0 (CPUS like 2-3 or 0+2)")
    add_passed_engine_arguments(p, "prefill / decode / colocated")
    p.add_argument("--otlp-endpoint", metavar="HOST:PORT",
                   help="every process exports OpenTelemetry traces to this OTLP/gRPC collector")
    p.add_argument("--start-timeout-s", type=float, default=300.0)
    p.add_argument("--log-level", default="WARNING")
    p.set_defaults(run=_run_serve)


def _run_serve(args) -> int:
    from epd.launcher import ServeOptions, serve
    from epd.worker_args import model_dir_or_demo

    try:
        options = ServeOptions(model_dir=model_dir_or_demo(args.model), host=args.host, port=args.port,
                               grpc_port=args.grpc_port,
                               encoders=args.encoders, prefills=args.prefills, decodes=args.decodes,
                               transfer=args.transfer, allow_url_hosts=tuple(args.allow_url_host),
                               start_timeout_s=args.start_timeout_s, log_level=args.log_level,
                               colocated=args.colocated, cpu_affinity=args.cpu_affinity,
                               engine_args=passed_engine_args(args), dtype=args.dtype, device=args.device,
                               gpus=args.gpus,
                               otlp_endpoint=args.otlp_endpoint)
    except ValueError as exc:
        print(f"epd serve: {exc}", file=sys.stderr)
        return 2
    return serve(options)


def _add_bench(commands) -> None:
    # epd.bench.cli imports only argparse at module level; its run() imports the load generator,
    # httpx, PIL (and, for compare, transformers) when a bench command actually runs.
    from epd.bench.cli import add_bench_arguments, run

    p = commands.add_parser("bench", help="load generator and comparison for OpenAI-compatible servers")
    add_bench_arguments(p)
    p.set_defaults(run=run)


def _add_ray(commands) -> None:
    # Ray itself is imported only when an `epd ray` command runs (it is the optional `ray` extra).
    from epd.ray_cluster.cli import add_ray_arguments

    p = commands.add_parser("ray", help="run the cluster on Ray: up, scale, status")
    add_ray_arguments(p)


if __name__ == "__main__":
    sys.exit(main())
