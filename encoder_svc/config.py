"""Encoder worker configuration: frozen, validated at start-up with errors naming the value."""

from __future__ import annotations

from dataclasses import dataclass

from epd.transfer_backends import TRANSFER_BACKENDS


@dataclass(frozen=True)
class EncoderConfig:
    model_dir: str
    transfer_backend: str = "grpc"  # how prefill workers pull embeddings: grpc | shm | nccl
    max_batch_images: int = 8  # images per vision-tower forward
    batch_wait_ms: float = 5.0  # after the first image arrives, wait this long for more to batch
    max_queue_images: int = 256  # images waiting for the tower; beyond this Encode is RESOURCE_EXHAUSTED
    cache_bytes: int = 512 << 20  # embedding store budget
    lease_ttl_s: float = 60.0  # an unacknowledged embedding handle is freed after this
    max_image_bytes: int = 20 << 20
    max_image_pixels: int = 33_177_600
    encode_timeout_s: float = 60.0  # used when the request carries no deadline

    def __post_init__(self) -> None:
        if self.transfer_backend not in TRANSFER_BACKENDS:
            raise ValueError(f"transfer backend must be one of {TRANSFER_BACKENDS}, got {self.transfer_backend!r}")
        for name in ("max_batch_images", "max_queue_images", "cache_bytes", "max_image_bytes", "max_image_pixels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("batch_wait_ms", "lease_ttl_s", "encode_timeout_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
