"""`epd colocated`: the image processor, the vision tower and ONE engine doing prefill and decode, in
one process — what disaggregation is measured against.

It serves the same Encoder, Prefill, Decode and Transfer services as the three separate workers
(the router cannot tell), composed from those packages: this module is a composition root like
the CLI, the one place that imports more than one service. Prompts and decodes share the engine's
batches, so a long prefill or a vision forward delays every stream's next token here.
"""

from __future__ import annotations

import argparse
import os
import sys

from encoder_svc.main import add_encoder_arguments, encoder_config
from epd.engine_args import add_engine_arguments, engine_config
from epd.worker_args import add_worker_arguments, setup_logging, worker_options
from prefill_svc.main import add_prefill_arguments, prefill_config

ROLE = "colocated"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_worker_arguments(p)
    add_engine_arguments(p)
    add_encoder_arguments(p)
    add_prefill_arguments(p)


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    from decode_svc.config import DecodeConfig
    from epd.models.errors import ModelLoadError
    from epd.models.processor_files import require_image_processor_config

    try:
        options = worker_options(args, long_calls=2 * args.max_running + args.max_queue)
        encoder_cfg, prefill_cfg = encoder_config(args), prefill_config(args)
        decode_cfg = DecodeConfig(model_dir=prefill_cfg.model_dir, max_running=args.max_running)
        require_image_processor_config(encoder_cfg.model_dir)  # before torch: fail in a second
        from epd.threads import single_threaded

        single_threaded()  # main only loads and waits: the compute thread gets the OpenMP team
        from epd.devices import resolve_device, use_device
        from epd.dtypes import resolve_dtype
        from epd.engine.encode import ImageEncoder
        from epd.engine.engine import Engine
        from epd.engine.pipeline import eos_token_ids
        from epd.models.loading import load_encoder, load_language_model

        device = use_device(resolve_device(args.device))
        dtype = resolve_dtype(args.dtype, device)
        encoder = ImageEncoder(load_encoder(encoder_cfg.model_dir, dtype, device), args.kernels)
        language = load_language_model(prefill_cfg.model_dir, dtype, device)
        engine = Engine(language, engine_config(args), eos_token_ids(language.model_dir, language.config), ROLE)
    except (ModelLoadError, ValueError) as exc:
        print(f"epd colocated: {exc}", file=sys.stderr)
        return 1
    return _serve(encoder, engine, encoder_cfg, prefill_cfg, decode_cfg, options)


def _serve(encoder, engine, encoder_cfg, prefill_cfg, decode_cfg, options) -> int:
    from decode_svc.service import DecodeService
    from decode_svc.servicer import DecodeServicer
    from encoder_svc.service import EncoderService
    from encoder_svc.servicer import EncoderServicer
    from epd.engine.loop import EngineLoop
    from epd.transfer.receiver import TransferReceiver
    from epd.transfer.sender import TransferSender
    from epd.v1 import decode_pb2, decode_pb2_grpc, encoder_pb2, encoder_pb2_grpc, prefill_pb2, prefill_pb2_grpc
    from epd.worker import add_transfer, run_worker
    from prefill_svc.service import PrefillService
    from prefill_svc.servicer import PrefillServicer

    sender = TransferSender(prefill_cfg.transfer_backend, owner_address="")
    receiver = TransferReceiver(timeout_s=prefill_cfg.pull_timeout_s)
    # Two compute threads (engine, vision batches) share the CPUs: one OpenMP team each, half the CPUs each.
    share = max(len(os.sched_getaffinity(0)) // 2, 1)
    loop = EngineLoop(engine, compute_threads=share)
    encoding = EncoderService(encoder, sender, encoder_cfg, compute_threads=share)
    prefill = PrefillService(loop, receiver, sender, prefill_cfg)
    decode = DecodeService(loop, receiver, decode_cfg)

    def add_services(server, address: str) -> list[str]:
        encoder_pb2_grpc.add_EncoderServicer_to_server(EncoderServicer(encoding), server)
        prefill_pb2_grpc.add_PrefillServicer_to_server(PrefillServicer(prefill), server)
        decode_pb2_grpc.add_DecodeServicer_to_server(DecodeServicer(decode), server)
        names = [pb.DESCRIPTOR.services_by_name[name].full_name
                 for pb, name in ((encoder_pb2, "Encoder"), (prefill_pb2, "Prefill"), (decode_pb2, "Decode"))]
        return [*names, add_transfer(server, address, sender)]

    def warm_up() -> None:
        loop.start()
        encoding.warm_up()
        prefill.warm_up()
        decode.warm_up()
        sender.start_reaper()

    return run_worker(ROLE, options, add_services, warm_up,
                      closers=[encoding.close, loop.close, receiver.close, sender.close])
