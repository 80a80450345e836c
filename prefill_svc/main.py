"""`epd prefill`: load the language side, start the engine, warm up, serve Prefill and Transfer (the KV it leases)."""

from __future__ import annotations

import argparse
import sys

from epd.engine_args import add_engine_arguments, engine_config
from epd.worker_args import add_worker_arguments, env_default, model_dir_or_demo, setup_logging, worker_options

ROLE = "prefill"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_worker_arguments(p)
    add_engine_arguments(p)
    add_prefill_arguments(p)


def add_prefill_arguments(p: argparse.ArgumentParser) -> None:
    """The prefill worker's own flags (also taken by the colocated worker)."""
    p.add_argument("--embedding-cache-mb", type=int, default=env_default("prefill_cache_mb", 256))
    p.add_argument("--kv-lease-ttl-s", type=float, default=env_default("kv_lease_ttl_s", 60.0))


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    from epd.models.errors import ModelLoadError
    from epd.models.processor_files import require_checkpoint_dir

    try:
        options = worker_options(args, long_calls=args.max_running + args.max_queue)
        config = prefill_config(args)
        require_checkpoint_dir(config.model_dir)  # before torch: fail in a second
        from epd.threads import single_threaded

        single_threaded()  # main only loads and waits: the compute thread gets the OpenMP team
        from epd.devices import resolve_device, use_device
        from epd.dtypes import resolve_dtype

        device = use_device(resolve_device(args.device))
        from epd.engine.engine import Engine
        from epd.engine.pipeline import eos_token_ids
        from epd.models.loading import load_language_model

        language = load_language_model(config.model_dir, resolve_dtype(args.dtype, device), device)
        engine = Engine(language, engine_config(args), eos_token_ids(language.model_dir, language.config), ROLE)
    except (ModelLoadError, ValueError) as exc:
        print(f"epd prefill: {exc}", file=sys.stderr)
        return 1
    return _serve(engine, config, options, device)


def prefill_config(args: argparse.Namespace):
    from prefill_svc.config import PrefillConfig

    return PrefillConfig(model_dir=model_dir_or_demo(args.model), transfer_backend=args.transfer,
                         embedding_cache_bytes=args.embedding_cache_mb << 20, kv_lease_ttl_s=args.kv_lease_ttl_s)


def _serve(engine, config, options, device) -> int:
    from epd.engine.loop import EngineLoop
    from epd.transfer.receiver import TransferReceiver
    from epd.transfer.sender import TransferSender
    from epd.v1 import prefill_pb2, prefill_pb2_grpc
    from epd.worker import add_transfer, run_worker
    from prefill_svc.service import PrefillService
    from prefill_svc.servicer import PrefillServicer

    sender = TransferSender(config.transfer_backend, owner_address="")
    receiver = TransferReceiver(timeout_s=config.pull_timeout_s, device=device)
    loop = EngineLoop(engine)
    service = PrefillService(loop, receiver, sender, config)

    def add_services(server, address: str) -> list[str]:
        prefill_pb2_grpc.add_PrefillServicer_to_server(PrefillServicer(service), server)
        return [prefill_pb2.DESCRIPTOR.services_by_name["Prefill"].full_name, add_transfer(server, address, sender)]

    def warm_up() -> None:
        loop.start()
        service.warm_up()
        sender.start_reaper()

    return run_worker(ROLE, options, add_services, warm_up, closers=[loop.close, receiver.close, sender.close])
