"""Command-line flags of the workers that run the engine (prefill, decode, colocated), with `EPD_*` defaults."""

from __future__ import annotations

import argparse

from epd.kernels import MODES as KERNEL_MODES
from epd.worker_args import env_default

# The engine flags a launcher (`epd serve`, `epd ray up`) takes and hands to the workers it starts:
# numbers, and flags with a fixed set of values.
PASSED_ENGINE_FLAGS = ("--kv-cache-mb", "--kv-blocks", "--max-running", "--max-batched-tokens", "--max-prefill-chunk",
                       "--decode-step-interval-ms")
DECODE_FORWARDS = ("direct", "module")  # epd.engine.direct_decode, or the model's modules
PASSED_ENGINE_CHOICES = {"--kernels": KERNEL_MODES, "--decode-forward": DECODE_FORWARDS}
ENCODER_TAKES = ("--kernels",)  # of those, the ones an encoder takes too (its vision tower's kernels)
ENGINE_ROLES = ("prefill", "decode", "colocated")  # the workers that run the engine
DEFAULT_DECODE_STEP_INTERVAL_MS = 0  # off: pacing trades inter-token latency for throughput (README)


def add_passed_engine_arguments(p: argparse.ArgumentParser, workers: str) -> None:
    """A launcher's copies of the engine flags (no defaults: an unset flag leaves the worker's own)."""
    for flag in PASSED_ENGINE_FLAGS:
        p.add_argument(flag, type=int, help=f"passed to every {workers} worker")
    for flag, choices in PASSED_ENGINE_CHOICES.items():
        also = " (and encoder)" if flag in ENCODER_TAKES else ""
        p.add_argument(flag, choices=choices, help=f"passed to every {workers} worker{also}")


def passed_engine_args(args: argparse.Namespace) -> tuple[str, ...]:
    """The engine flags a launcher was given, as worker command-line arguments."""
    passed: list[str] = []
    for flag in (*PASSED_ENGINE_FLAGS, *PASSED_ENGINE_CHOICES):
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            passed += [flag, str(value)]
    return tuple(passed)


def passed_to(role: str, passed: tuple[str, ...]) -> tuple[str, ...]:
    """Of a launcher's `passed_engine_args` (flag, value, flag, value, ...), what a worker of `role`
    takes: all of them for an engine worker, `ENCODER_TAKES` for an encoder, none otherwise; pure."""
    if role in ENGINE_ROLES:
        return passed
    takes = ENCODER_TAKES if role == "encoder" else ()
    pairs = zip(passed[::2], passed[1::2], strict=True)
    return tuple(item for flag, value in pairs if flag in takes for item in (flag, value))


def add_kernels_argument(p, what: str) -> None:
    """`--kernels` for a worker (on a parser or an argument group); `what` it runs natively, for the help."""
    p.add_argument("--kernels", choices=KERNEL_MODES, default=env_default("kernels", "auto"),
                   help=f"on a CPU: native (our C++ kernels: {what}; built on a first start, about 5 s), "
                        "torch (torch's operators), or auto (native where they build and pass their self-check, "
                        "else torch; default)")


def add_decode_forward_argument(p) -> None:
    """`--decode-forward` for an engine worker or a benchmark (on a parser or an argument group)."""
    p.add_argument("--decode-forward", choices=DECODE_FORWARDS, default=env_default("decode_forward", "direct"),
                   help="decode-only steps: direct (calls on the layers' weights, the same bits with less Python "
                        "per step; where the native float32 kernels run, else the modules) or module (through "
                        "the model's modules, as prompt steps; default: direct)")


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--kv-cache-mb", type=int, default=env_default("kv_cache_mb", 1024),
                   help="KV block pool budget in MiB (default 1024); a full pool refuses new work")
    g.add_argument("--kv-blocks", type=int, default=env_default("kv_blocks", 0),
                   help="KV blocks in the pool, instead of --kv-cache-mb (0: use the budget)")
    g.add_argument("--block-size", type=int, default=env_default("block_size", 16), help="tokens per KV block")
    g.add_argument("--max-running", type=int, default=env_default("max_running", 64),
                   help="sequences in the running batch")
    g.add_argument("--max-batched-tokens", type=int, default=env_default("max_batched_tokens", 2048),
                   help="tokens in one forward")
    g.add_argument("--max-prefill-chunk", type=int, default=env_default("max_prefill_chunk", 512),
                   help="prompt tokens of one sequence per forward; longer prompts are chunked")
    g.add_argument("--max-queue", type=int, default=env_default("max_queue", 256),
                   help="sequences waiting for blocks or budget; beyond this RESOURCE_EXHAUSTED")
    g.add_argument("--scheduler-policy", choices=("decode_first", "fcfs"),
                   default=env_default("scheduler_policy", "decode_first"))
    g.add_argument("--no-prefix-cache", action="store_true", help="never reuse KV blocks across requests")
    add_kernels_argument(g, "the decode attention reading the KV pool in place, a fused RMSNorm, the MoE "
                            "experts' end, a decode step's experts and, in float32, its dense products and "
                            "latent attention's rope; a colocated worker's vision GELU too")
    add_decode_forward_argument(g)
    g.add_argument("--decode-step-interval-ms", type=int,
                   default=env_default("decode_step_interval_ms", DEFAULT_DECODE_STEP_INTERVAL_MS),
                   help="decode workers on a CPU whose cores other processes keep busy (an encoder, a "
                        "prefill worker): start a decode step at most this often, so batches grow and the "
                        "cores go to the front end; more tokens/s, slower streams (e.g. 150; default 0: "
                        "step at once; no effect on cores of its own, on a GPU, or on prefill and "
                        "colocated workers)")


def decode_pacing(args: argparse.Namespace, device):
    """The DecodePacing the flags ask for on `device`, or None (off, or a GPU: host cores do not decode)."""
    from epd.engine.pacing import DecodePacing

    if args.decode_step_interval_ms < 0:
        raise ValueError(f"--decode-step-interval-ms must be >= 0, got {args.decode_step_interval_ms}")
    if args.decode_step_interval_ms == 0 or device.type != "cpu":
        return None
    return DecodePacing(args.decode_step_interval_ms / 1000)


def engine_config(args: argparse.Namespace):
    """The EngineConfig the flags describe (ValueError naming a bad value)."""
    from epd.engine.engine import EngineConfig
    from epd.engine.scheduler import SchedulerConfig

    scheduler = SchedulerConfig(max_running=args.max_running, max_batched_tokens=args.max_batched_tokens,
                                max_prefill_chunk=args.max_prefill_chunk, max_waiting=args.max_queue,
                                policy=args.scheduler_policy)
    if args.kv_blocks < 0 or args.kv_cache_mb < 1:
        raise ValueError(f"--kv-blocks must be >= 0 and --kv-cache-mb >= 1, got {args.kv_blocks}, {args.kv_cache_mb}")
    return EngineConfig(block_size=args.block_size, kv_cache_bytes=args.kv_cache_mb << 20,
                        num_blocks=args.kv_blocks or None, enable_prefix_cache=not args.no_prefix_cache,
                        kernels=args.kernels, direct_decode=args.decode_forward == "direct", scheduler=scheduler)
