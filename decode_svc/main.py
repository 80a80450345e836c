"""`epd decode`: load the language side, warm up, serve Decode (pulling KV from prefill workers)."""

from __future__ import annotations

import argparse
import sys

from epd.worker_args import add_worker_arguments, env_default, model_dir_or_demo, setup_logging, worker_options

ROLE = "decode"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_worker_arguments(p)
    p.add_argument("--max-running", type=int, default=env_default("max_running", 64),
                   help="sequences decoding at once")


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    from decode_svc.config import DecodeConfig
    from epd.models.errors import ModelLoadError

    try:
        options = worker_options(args)
        config = DecodeConfig(model_dir=model_dir_or_demo(args.model), max_running=args.max_running)
        from epd.engine.pipeline import eos_token_ids
        from epd.models.loading import load_language_model

        language = load_language_model(config.model_dir)
    except (ModelLoadError, ValueError) as exc:
        print(f"epd decode: {exc}", file=sys.stderr)
        return 1
    return _serve(language, eos_token_ids(language.model_dir, language.config), config, options)


def _serve(language, eos, config, options) -> int:
    from decode_svc.service import DecodeService
    from decode_svc.servicer import DecodeServicer
    from epd.engine.language import LanguageRunner
    from epd.transfer.receiver import TransferReceiver
    from epd.v1 import decode_pb2, decode_pb2_grpc
    from epd.worker import run_worker

    receiver = TransferReceiver(timeout_s=config.pull_timeout_s)
    service = DecodeService(LanguageRunner(language), receiver, eos, config)

    def add_services(server, address: str) -> list[str]:
        decode_pb2_grpc.add_DecodeServicer_to_server(DecodeServicer(service), server)
        return [decode_pb2.DESCRIPTOR.services_by_name["Decode"].full_name]

    return run_worker(ROLE, options, add_services, service.warm_up, closers=[receiver.close])
