"""`epd ray up | scale | status`: the cluster's roles as Ray actors, the router on the driver's node."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from epd.dtypes import DTYPES
from epd.engine_args import add_passed_engine_arguments, passed_engine_args


def add_ray_arguments(p: argparse.ArgumentParser) -> None:
    commands = p.add_subparsers(dest="ray_command", required=True)
    up = commands.add_parser("up", help="start (or join) a Ray cluster, place the workers as actors, serve HTTP")
    up.add_argument("--model", help="checkpoint directory, the same path on every node "
                                    "(default: the cached demo checkpoint)")
    up.add_argument("--address", help="the Ray cluster to join (e.g. auto, or HOST:6379); default: start a "
                                      "local one, stopped again on exit")
    up.add_argument("--local-cpus", type=int, help="CPUs a locally started Ray offers (default: max(cores, 16): "
                                                   "one machine's workers share its cores)")
    for role in ("encoders", "prefills", "decodes"):
        up.add_argument(f"--{role}", type=int, default=1)
    up.add_argument("--host", default="127.0.0.1", help="the router's HTTP host")
    up.add_argument("--port", type=int, default=8000, help="the router's HTTP port (0: pick a free one)")
    up.add_argument("--grpc-port", type=int, default=0, help="the router's gRPC port (0: pick a free one)")
    up.add_argument("--worker-host", default="127.0.0.1",
                    help="what workers bind and advertise to their peers; node-ip: each worker its own node's "
                         "IP (for workers on several nodes)")
    up.add_argument("--cpus-per-worker", type=float, default=1.0, help="Ray CPUs each worker actor holds")
    up.add_argument("--gpus-per-worker", type=float,
                    help="Ray GPUs each worker actor holds (default: 1 where the cluster has GPUs, else 0)")
    up.add_argument("--transfer", choices=("grpc", "shm"), default="grpc")
    up.add_argument("--dtype", choices=DTYPES, default="auto")
    add_passed_engine_arguments(up, "prefill / decode")
    up.add_argument("--allow-url-host", action="append", default=[], metavar="HOST[:PORT]")
    up.add_argument("--otlp-endpoint", metavar="HOST:PORT")
    up.add_argument("--name", default="epd", help="the cluster's name on Ray (`epd ray scale --name`)")
    up.add_argument("--start-timeout-s", type=float, default=300.0)
    up.add_argument("--drain-timeout-s", type=float, default=120.0,
                    help="how long a scaled-down worker may finish its requests before it is stopped")
    up.add_argument("--log-level", default="WARNING")
    up.set_defaults(run=_run_up)

    scale = commands.add_parser("scale", help="set a role's replica count of a running `epd ray up`")
    scale.add_argument("role", choices=("encoder", "prefill", "decode"))
    scale.add_argument("replicas", type=int)
    scale.add_argument("--address", default="auto", help="the Ray cluster (default: auto)")
    scale.add_argument("--name", default="epd")
    scale.set_defaults(run=_run_scale)

    status = commands.add_parser("status", help="the workers of a running `epd ray up`, as JSON")
    status.add_argument("--address", default="auto")
    status.add_argument("--name", default="epd")
    status.set_defaults(run=_run_status)


def spec_from_args(args: argparse.Namespace):
    from epd.ray_cluster.plan import RayClusterSpec
    from epd.worker_args import model_dir_or_demo

    return RayClusterSpec(
        model_dir=model_dir_or_demo(args.model), encoders=args.encoders, prefills=args.prefills,
        decodes=args.decodes, host=args.host, port=args.port, grpc_port=args.grpc_port,
        worker_host=args.worker_host, cpus_per_worker=args.cpus_per_worker, gpus_per_worker=args.gpus_per_worker,
        transfer=args.transfer, dtype=args.dtype, worker_args=passed_engine_args(args),
        allow_url_hosts=tuple(args.allow_url_host), otlp_endpoint=args.otlp_endpoint, log_level=args.log_level,
        start_timeout_s=args.start_timeout_s, drain_timeout_s=args.drain_timeout_s, name=args.name)


def _run_up(args: argparse.Namespace) -> int:
    from epd.ray_cluster.api import RayCluster

    try:
        spec = spec_from_args(args)
    except ValueError as exc:
        print(f"epd ray up: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    cluster = RayCluster(spec, address=args.address, local_cpus=args.local_cpus)
    try:
        url = cluster.start()
        # After ray.init, which installs its own SIGTERM handler (it logs and exits at once, before
        # the teardown below could stop the router and drain the workers). A signal during start
        # needs no teardown of ours: Ray removes a dead driver's actors and their processes.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        print(f"EPD cluster ready: {url}/v1 (OpenAI-compatible, on Ray; gRPC Router at {cluster.grpc_address}); "
              f"`epd ray scale ROLE N` resizes it, Ctrl-C stops it", flush=True)
        while not stop.wait(0.5):
            pass
        return 0
    except Exception as exc:  # Ray's errors and our start-up failures alike: one line, exit 1
        print(f"epd ray up: {exc}", file=sys.stderr)
        return 1
    finally:
        cluster.stop()


def _run_scale(args: argparse.Namespace) -> int:
    from epd.ray_cluster.api import scale

    try:
        result = scale(args.role, args.replicas, address=args.address, name=args.name)
    except (RuntimeError, ValueError, ConnectionError) as exc:
        print(f"epd ray scale: {exc}", file=sys.stderr)
        return 1
    counts = {}
    for worker in result["workers"]:
        counts[worker["role"]] = counts.get(worker["role"], 0) + 1
    print(f"epd ray scale: {args.role} now has {counts.get(args.role, 0)} worker(s); "
          + ", ".join(f"{role}={n}" for role, n in sorted(counts.items())), flush=True)
    return 0


def _run_status(args: argparse.Namespace) -> int:
    from epd.ray_cluster.api import status

    try:
        print(json.dumps(status(address=args.address, name=args.name), indent=1))
    except (RuntimeError, ConnectionError) as exc:
        print(f"epd ray status: {exc}", file=sys.stderr)
        return 1
    return 0
