"""Command-line flags every worker shares (`epd encoder|prefill|decode`), with `EPD_*` environment defaults."""

from __future__ import annotations

import argparse
import logging
import os

from epd.devices import DEVICE_HELP, check_device
from epd.dtypes import DTYPES
from epd.transfer_backends import TRANSFER_BACKENDS, TRANSFER_HELP
from epd.worker import WorkerOptions


def env_default(name: str, default):
    """`EPD_<NAME>` from the environment, converted to the default's type, else the default."""
    raw = os.environ.get(f"EPD_{name.upper()}")
    if raw is None:
        return default
    return type(default)(raw) if default is not None else raw


def add_worker_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=env_default("model", None),
                   help="checkpoint directory (default: the cached demo checkpoint)")
    p.add_argument("--host", default=env_default("host", "127.0.0.1"), help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=env_default("port", 0), help="gRPC port (0: pick a free one)")
    p.add_argument("--metrics-port", type=int, default=env_default("metrics_port", 0),
                   help="Prometheus /metrics port (0: pick a free one)")
    p.add_argument("--ready-file", default=None,
                   help="write {role, address, metrics_port, pid} here as JSON once ready (for launchers)")
    p.add_argument("--transfer", choices=TRANSFER_BACKENDS, default=env_default("transfer", "grpc"),
                   help=TRANSFER_HELP)
    p.add_argument("--dtype", choices=DTYPES, default=env_default("dtype", "auto"),
                   help="weights, activations and KV cache (auto: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--device", type=check_device, default=env_default("device", "auto"), help=DEVICE_HELP)
    p.add_argument("--threads", type=int, default=env_default("threads", 0),
                   help="gRPC handler threads (0: enough for every long call plus a reserve for short ones)")
    p.add_argument("--log-level", default=env_default("log_level", "WARNING"))
    p.add_argument("--otlp-endpoint", default=env_default("otlp_endpoint", None), metavar="HOST:PORT",
                   help="export OpenTelemetry traces to this OTLP/gRPC collector (default: no tracing)")
    from epd.tls import add_mtls_arguments

    add_mtls_arguments(p)


# Threads kept free of long calls (decode streams, prefills waiting on the engine), so that health
# checks, transfer pulls and cancels never queue behind them: a healthy worker is never ejected.
SHORT_CALL_THREADS = 16


def worker_options(args: argparse.Namespace, long_calls: int = 48) -> WorkerOptions:
    """`long_calls`: how many calls the role's own admission lets block at once."""
    from epd.tracing import check_available

    check_available(args.otlp_endpoint)
    from epd import tls

    tls.configure(tls.from_args(args))  # process-wide: this worker's server and its pull channels
    threads = args.threads or long_calls + SHORT_CALL_THREADS
    return WorkerOptions(host=args.host, port=args.port, metrics_port=args.metrics_port,
                         ready_file=args.ready_file, threads=threads, max_concurrent_rpcs=threads + 64,
                         otlp_endpoint=args.otlp_endpoint)


def setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def model_dir_or_demo(model: str | None) -> str:
    if model:
        return model
    from epd.demo import demo_model_dir

    return str(demo_model_dir())
