"""`epd` command line: one subcommand per job."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from epd.tiny.families import FAMILIES, SIZES


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="epd", description="EPD cluster: disaggregated multimodal MoE serving")
    commands = parser.add_subparsers(dest="command", required=True)
    _add_make_tiny_model(commands)
    _add_generate(commands)
    args = parser.parse_args(argv)
    return args.run(args)


def _add_make_tiny_model(commands) -> None:
    p = commands.add_parser("make-tiny-model", help="write a randomly drawn checkpoint directory")
    p.add_argument("--family", choices=sorted(FAMILIES), required=True)
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
    from epd.engine.sampling import SamplingParams
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


if __name__ == "__main__":
    sys.exit(main())
