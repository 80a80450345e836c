"""`epd decode`: load the language side, start the engine, serve Decode (pulling KV from prefill workers)."""

from __future__ import annotations

import argparse
import sys

from epd.engine_args import add_engine_arguments, decode_pacing, engine_config
from epd.worker_args import add_worker_arguments, model_dir_or_demo, setup_logging, worker_options

ROLE = "decode"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_worker_arguments(p)
    add_engine_arguments(p)


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    from decode_svc.config import DecodeConfig
    from epd.models.errors import ModelLoadError
    from epd.models.processor_files import require_checkpoint_dir

    try:
        options = worker_options(args, long_calls=args.max_running)
        config = DecodeConfig(model_dir=model_dir_or_demo(args.model), max_running=args.max_running)
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
        pacing = decode_pacing(args, device)
    except (ModelLoadError, ValueError) as exc:
        print(f"epd decode: {exc}", file=sys.stderr)
        return 1
    return _serve(engine, config, options, device, pacing)


def _serve(engine, config, options, device, pacing) -> int:
    from decode_svc.service import DecodeService
    from decode_svc.servicer import DecodeServicer
    from epd.engine.loop import EngineLoop
    from epd.transfer.receiver import TransferReceiver
    from epd.v1 import decode_pb2, decode_pb2_grpc
    from epd.worker import run_worker

    receiver = TransferReceiver(timeout_s=config.pull_timeout_s, device=device)
    loop = EngineLoop(engine, pacing=pacing)
    service = DecodeService(loop, receiver, config)

    def add_services(server, address: str) -> list[str]:
        decode_pb2_grpc.add_DecodeServicer_to_server(DecodeServicer(service), server)
        return [decode_pb2.DESCRIPTOR.services_by_name["Decode"].full_name]

    def warm_up() -> None:
        loop.start()
        service.warm_up()

    return run_worker(ROLE, options, add_services, warm_up, closers=[loop.close, receiver.close])
