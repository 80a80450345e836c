"""`epd router`: the OpenAI-compatible HTTP gateway and the gRPC Router API in one process.

It loads only the tokenizer and the config (chat template, image token id): no weights, no image
processor — those belong to the workers.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from contextlib import asynccontextmanager
from pathlib import Path

from epd.tls import add_mtls_arguments
from epd.worker_args import env_default, model_dir_or_demo, setup_logging
from router.limit_args import add_limit_arguments
from router.security import add_security_arguments, check_security_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=env_default("model", None), help="checkpoint directory (tokenizer, template)")
    p.add_argument("--model-name", default=None, help="the id clients pass as `model` (default: directory name)")
    p.add_argument("--host", default=env_default("host", "127.0.0.1"))
    p.add_argument("--port", type=int, default=env_default("port", 8000), help="HTTP port (0: pick a free one)")
    p.add_argument("--grpc-port", type=int, default=env_default("grpc_port", 0),
                   help="port of the gRPC Router API (0: pick a free one)")
    for role in ("encoder", "prefill", "decode"):
        p.add_argument(f"--{role}", action="append", default=[], metavar="HOST:PORT[,metrics=URL]",
                       help=f"a {role} worker; repeatable")
    p.add_argument("--discover-dns", action="append", default=[], metavar="ROLE=NAME:PORT[,metrics_port=P]",
                   help="workers of ROLE at every address NAME resolves to (re-resolved; e.g. a headless Service)")
    p.add_argument("--workers-file", metavar="PATH",
                   help='workers listed in a JSON file {"workers": [{"role", "address", "metrics_url"}]}, re-read '
                        "when it changes")
    p.add_argument("--discover-interval-s", type=float, default=5.0, help="how often DNS names are re-resolved")
    p.add_argument("--dns-server", metavar="HOST:PORT", help="resolve --discover-dns names here, not via resolv.conf")
    p.add_argument("--allow-url-host", action="append", default=[], metavar="HOST[:PORT]",
                   help="let image URLs reach this host (or network, e.g. 10.0.0.0/8) even if it is loopback/private; "
                        "repeatable")
    p.add_argument("--encoder-policy", default="affinity")
    p.add_argument("--prefill-policy", default="least_outstanding_tokens")
    p.add_argument("--decode-policy", default="least_outstanding")
    add_limit_arguments(p)
    add_security_arguments(p)
    add_mtls_arguments(p, with_cert=False)  # the router presents its --tls-cert/--tls-key to workers
    p.add_argument("--request-timeout-s", type=float, default=600.0)
    p.add_argument("--max-concurrent-requests", type=int, default=512,
                   help="requests worked on at once; beyond this the router answers 429 at once")
    p.add_argument("--ready-file", default=None)
    p.add_argument("--supervision-file", default=None, metavar="PATH",
                   help="JSON a launcher (epd serve) keeps of each worker's restarts, shown in /workers")
    p.add_argument("--otlp-endpoint", default=env_default("otlp_endpoint", None), metavar="HOST:PORT",
                   help="export OpenTelemetry traces to this OTLP/gRPC collector (default: no tracing)")
    p.add_argument("--log-level", default=env_default("log_level", "WARNING"))


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    from epd import tracing
    from epd.models.errors import ModelLoadError

    try:
        tracing.check_available(args.otlp_endpoint)
    except ValueError as exc:
        print(f"epd router: {exc}", file=sys.stderr)
        return 1
    tracing.setup("router", args.otlp_endpoint)
    try:
        check_security_arguments(args)
        from epd import tls

        tls.configure(tls.from_args(args, cert_alone_ok=True))  # before the registry opens its channels
        gateway = build_gateway(args)
        sock = socket.create_server((args.host, args.port), reuse_port=False)
    except (OSError, ValueError, ModelLoadError) as exc:
        print(f"epd router: {exc}", file=sys.stderr)
        return 1
    try:
        return asyncio.run(_serve(args, gateway, sock))
    finally:
        tracing.shutdown()


def build_gateway(args: argparse.Namespace):
    from epd.models.processor_files import require_checkpoint_dir

    model_dir = require_checkpoint_dir(model_dir_or_demo(args.model))  # before transformers: fail in a second
    import httpx
    from transformers import AutoConfig, AutoTokenizer

    from epd import metrics
    from router.admission import Admission
    from router.frontend import Frontend
    from router.http_app import Gateway
    from router.image_source import allowed_networks
    from router.limit_args import image_limits, request_limits
    from router.limits import context_length
    from router.offload import Offload
    from router.orchestrator import Orchestrator
    from router.workers import WorkerRegistry, WorkerSpec

    specs = [WorkerSpec.parse(role, text) for role in ("encoder", "prefill", "decode")
             for text in getattr(args, role)]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    image_token_id = int(config.image_token_id)
    registry = WorkerRegistry(specs, supervision_file=args.supervision_file)
    discovery = discovery_sources(args, registry)
    orchestrator = Orchestrator(registry, image_token_id, encoder_policy=args.encoder_policy,
                                prefill_policy=args.prefill_policy, decode_policy=args.decode_policy)
    allowed_hosts = frozenset(h.lower() for h in args.allow_url_host)
    allowed_networks(allowed_hosts)  # a malformed CIDR fails at start, not on the first request
    frontend = Frontend(tokenizer=tokenizer, http=httpx.AsyncClient(follow_redirects=False),
                        image_limits=image_limits(args), allowed_hosts=allowed_hosts,
                        max_prompt_tokens=args.max_prompt_tokens, request_timeout_s=args.request_timeout_s,
                        context_length=context_length(config), offload=Offload(args.cpu_threads))
    limits = request_limits(args)
    admission = Admission(args.max_concurrent_requests, on_change=metrics.RUNNING.labels("router").set)
    return Gateway(args.model_name or model_dir.name, registry, orchestrator, frontend, limits, admission,
                   discovery, max_body_bytes=args.max_body_bytes, body_timeout_s=args.body_timeout_s,
                   api_key=args.api_key)


def discovery_sources(args: argparse.Namespace, registry) -> list:
    """The DNS and file discovery the flags ask for (ValueError naming a bad flag)."""
    from router.discovery import DnsDiscovery, DnsTarget, FileDiscovery

    sources: list = []
    if args.discover_dns:
        targets = [DnsTarget.parse(text) for text in args.discover_dns]
        sources.append(DnsDiscovery(registry, targets, args.discover_interval_s, args.dns_server))
    if args.workers_file:
        sources.append(FileDiscovery(registry, args.workers_file))
    if not sources and not registry.specs:
        raise ValueError("no workers: give --encoder/--prefill/--decode, --discover-dns or --workers-file")
    return sources


def _add_router_port(server, args: argparse.Namespace) -> int:
    """The gRPC Router API's port: TLS (no client certificate asked) when the gateway has TLS."""
    address = f"{args.host}:{args.grpc_port}"
    if not args.tls_cert:
        return server.add_insecure_port(address)
    import grpc

    pair = (Path(args.tls_key).read_bytes(), Path(args.tls_cert).read_bytes())
    return server.add_secure_port(address, grpc.ssl_server_credentials([pair]))


async def _serve(args: argparse.Namespace, gateway, sock: socket.socket) -> int:
    import grpc
    import uvicorn

    from epd.heap import freeze_startup_heap
    from epd.v1 import router_pb2_grpc
    from epd.worker import write_ready_file
    from router.grpc_api import RouterServicer
    from router.http_app import create_app

    # The same ceiling as the HTTP body: images travel as bytes here, as base64 there.
    size = [("grpc.max_receive_message_length", gateway.max_body_bytes)]
    grpc_server = grpc.aio.server(options=size)
    router_pb2_grpc.add_RouterServicer_to_server(RouterServicer(gateway), grpc_server)
    grpc_port = _add_router_port(grpc_server, args)
    http_port = sock.getsockname()[1]

    @asynccontextmanager
    async def lifespan(_app):
        await gateway.registry.start()
        for source in gateway.discovery:  # a first look before serving, then on their own schedule
            refreshed = source.refresh()
            if asyncio.iscoroutine(refreshed):
                await refreshed
        await gateway.registry.poll_once()
        tasks = [asyncio.create_task(source.run(), name=f"epd-discovery-{i}")
                 for i, source in enumerate(gateway.discovery)]
        await grpc_server.start()
        freeze_startup_heap()  # what starting made lives as long as the process (epd.heap)
        write_ready_file(args.ready_file, {"role": "router", "http_port": http_port, "grpc_port": grpc_port})
        scheme = "https" if args.tls_cert else "http"
        print(f"epd router: serving {scheme}://{args.host}:{http_port}/v1 (gRPC Router on {args.host}:{grpc_port})",
              flush=True)
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await grpc_server.stop(2.0)
            await gateway.registry.close()
            await gateway.frontend.http.aclose()
            gateway.frontend.offload.close()

    config = uvicorn.Config(create_app(gateway, lifespan), log_level=args.log_level.lower(),
                            timeout_graceful_shutdown=3, ssl_certfile=args.tls_cert, ssl_keyfile=args.tls_key)
    await uvicorn.Server(config).serve(sockets=[sock])
    return 0

