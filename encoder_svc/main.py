"""`epd encoder`: load the image processor and the vision tower, warm up, serve Encode and Transfer."""

from __future__ import annotations

import argparse
import sys

from epd.engine_args import add_kernels_argument
from epd.worker_args import add_worker_arguments, env_default, model_dir_or_demo, setup_logging, worker_options

ROLE = "encoder"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_worker_arguments(p)
    add_encoder_arguments(p)
    # The colocated worker takes this flag with the engine's (epd.engine_args), for both its parts.
    add_kernels_argument(p, "the vision tower's GELU")


def add_encoder_arguments(p: argparse.ArgumentParser) -> None:
    """The encoder's own flags (also taken by the colocated worker)."""
    p.add_argument("--max-batch-images", type=int, default=env_default("max_batch_images", 0),
                   help="images per vision-tower forward (0: 4 on a CPU, where batching saves no work and "
                        "smaller batches reach the prefill worker sooner; 8 on a GPU)")
    p.add_argument("--batch-wait-ms", type=float, default=env_default("batch_wait_ms", 5.0))
    p.add_argument("--cache-mb", type=int, default=env_default("encoder_cache_mb", 512),
                   help="embedding store budget in MiB")
    p.add_argument("--lease-ttl-s", type=float, default=env_default("lease_ttl_s", 60.0))


def run(args: argparse.Namespace) -> int:
    setup_logging(args.log_level)
    from epd.models.errors import ModelLoadError
    from epd.models.processor_files import require_image_processor_config

    try:
        options = worker_options(args)
        config = encoder_config(args)
        # Checked before importing torch/transformers (seconds), so a broken deployment fails at once.
        require_image_processor_config(config.model_dir)
        from epd.threads import single_threaded

        single_threaded()  # main only loads and waits: the compute thread gets the OpenMP team
        from epd.devices import resolve_device, use_device
        from epd.dtypes import resolve_dtype

        device = use_device(resolve_device(args.device))
        from epd.engine.encode import ImageEncoder
        from epd.models.loading import load_encoder

        # Before any port is bound: without its image processor an encoder must never look alive.
        encoder = ImageEncoder(load_encoder(config.model_dir, resolve_dtype(args.dtype, device), device), args.kernels)
    except (ModelLoadError, ValueError, RuntimeError) as exc:  # RuntimeError: --kernels native without them
        print(f"epd encoder: {exc}", file=sys.stderr)
        return 1
    return _serve(encoder, config, options)


def encoder_config(args: argparse.Namespace):
    from encoder_svc.config import EncoderConfig

    return EncoderConfig(model_dir=model_dir_or_demo(args.model), transfer_backend=args.transfer,
                         max_batch_images=args.max_batch_images, batch_wait_ms=args.batch_wait_ms,
                         cache_bytes=args.cache_mb << 20, lease_ttl_s=args.lease_ttl_s)


def _serve(encoder, config, options) -> int:
    from encoder_svc.service import EncoderService
    from encoder_svc.servicer import EncoderServicer
    from epd.transfer.sender import TransferSender
    from epd.v1 import encoder_pb2, encoder_pb2_grpc
    from epd.worker import add_transfer, run_worker

    sender = TransferSender(config.transfer_backend, owner_address="")
    service = EncoderService(encoder, sender, config)

    def add_services(server, address: str) -> list[str]:
        encoder_pb2_grpc.add_EncoderServicer_to_server(EncoderServicer(service), server)
        return [encoder_pb2.DESCRIPTOR.services_by_name["Encoder"].full_name, add_transfer(server, address, sender)]

    def warm_up() -> None:
        service.warm_up()
        sender.start_reaper()

    return run_worker(ROLE, options, add_services, warm_up, closers=[service.close, sender.close])
