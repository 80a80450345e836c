"""The router's request limits as command-line flags (each also `EPD_<FLAG>` in the environment)."""

from __future__ import annotations

import argparse

from epd.worker_args import env_default
from router.chat_request import RequestLimits
from router.image_source import DEFAULT_FORMATS, ImageLimits
from router.limits import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES


def add_limit_arguments(p: argparse.ArgumentParser) -> None:
    mib = 1024 * 1024
    p.add_argument("--max-body-bytes", type=int, default=env_default("max_body_bytes", DEFAULT_MAX_BODY_BYTES),
                   help=f"request body size (HTTP 413 beyond it; also the gRPC Router's receive limit) "
                        f"(default {DEFAULT_MAX_BODY_BYTES // mib} MiB)")
    p.add_argument("--body-timeout-s", type=float, default=env_default("body_timeout_s", DEFAULT_BODY_TIMEOUT_S),
                   help="the whole request body must arrive within this (HTTP 408 beyond it)")
    p.add_argument("--max-images", type=int, default=env_default("max_images", 8), help="images per request")
    p.add_argument("--max-image-bytes", type=int, default=env_default("max_image_bytes", ImageLimits.max_bytes),
                   help=f"encoded bytes per image (default {ImageLimits.max_bytes // mib} MiB)")
    p.add_argument("--max-image-pixels", type=int, default=env_default("max_image_pixels", ImageLimits.max_pixels),
                   help="width x height per image, read from the header before decoding (default 7680x4320)")
    p.add_argument("--min-image-side", type=int, default=env_default("min_image_side", ImageLimits.min_side),
                   help="shortest side in pixels (a 1xN image has no patch grid)")
    p.add_argument("--max-image-aspect-ratio", type=float,
                   default=env_default("max_image_aspect_ratio", ImageLimits.max_aspect_ratio),
                   help="long side / short side")
    p.add_argument("--image-formats", default=env_default("image_formats", ",".join(DEFAULT_FORMATS)),
                   help="comma-separated Pillow formats images may be in")
    p.add_argument("--image-fetch-timeout-s", type=float,
                   default=env_default("image_fetch_timeout_s", ImageLimits.fetch_timeout_s),
                   help="one image URL fetch, lookups and redirects included")
    p.add_argument("--max-tokens-limit", type=int, default=env_default("max_tokens_limit", 4096),
                   help="largest max_tokens a request may ask for")
    p.add_argument("--max-prompt-tokens", type=int, default=env_default("max_prompt_tokens", 32768),
                   help="prompt tokens (text) per request; prompt + max_tokens must also fit the model's context")
    p.add_argument("--cpu-threads", type=int, default=env_default("cpu_threads", 4),
                   help="threads for JSON, base64, image decoding, templating and (de)tokenization")


def image_limits(args: argparse.Namespace) -> ImageLimits:
    formats = tuple(f.strip().upper() for f in args.image_formats.split(",") if f.strip())
    return ImageLimits(max_bytes=args.max_image_bytes, max_pixels=args.max_image_pixels,
                       fetch_timeout_s=args.image_fetch_timeout_s, formats=formats, min_side=args.min_image_side,
                       max_aspect_ratio=args.max_image_aspect_ratio)


def request_limits(args: argparse.Namespace) -> RequestLimits:
    if args.max_body_bytes < 1:
        raise ValueError(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    if not args.body_timeout_s > 0:
        raise ValueError(f"--body-timeout-s must be > 0, got {args.body_timeout_s}")
    if args.max_prompt_tokens < 1:
        raise ValueError(f"--max-prompt-tokens must be >= 1, got {args.max_prompt_tokens}")
    return RequestLimits(max_images=args.max_images, max_tokens_limit=args.max_tokens_limit)
