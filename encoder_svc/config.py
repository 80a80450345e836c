"""Encoder worker configuration: frozen, validated at start-up with errors naming the value."""

from __future__ import annotations

from dataclasses import dataclass

from epd.transfer_backends import TRANSFER_BACKENDS


@dataclass(frozen=True)
class EncoderConfig:
    model_dir: str
    transfer_backend: str = "grpc"  # how prefill workers pull embeddings: grpc | shm | nccl
    max_batch_images: int = 0  # images per vision-tower forward; 0: by device (max_batch_images_for)
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
        for name in ("max_queue_images", "cache_bytes", "max_image_bytes", "max_image_pixels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_batch_images < 0:
            raise ValueError(f"max_batch_images must be >= 0 (0: by device), got {self.max_batch_images}")
        for name in ("batch_wait_ms", "lease_ttl_s", "encode_timeout_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


def max_batch_images_for(requested: int, device_type: str) -> int:
    """Images per vision-tower forward: `requested`, or for 0, 4 on a CPU and 8 on an accelerator (pure).

    On a GPU a forward of several images fills the device where one image leaves it idle. On a CPU
    batching saves nothing: the small checkpoints' towers took the same CPU time per image in
    batches of 2 and 4, and 3-12% more in batches of 8 (their activations outgrow the cache; one
    thread, 8 images, both dtypes). What a large batch does cost there is time: the first prompt can
    start only when its batch is done, so under a burst of requests the prefill and decode workers
    waited for 8 images instead of 4. With 4, 16 concurrent image requests gave 3-11% more tokens/s
    and a lower median TTFT (paired servers, both small checkpoints, bfloat16). 4 rather than 2 keeps
    a four-image request in one forward.
    """
    if requested < 0:
        raise ValueError(f"max_batch_images must be >= 0, got {requested}")
    if requested:
        return requested
    return 4 if device_type == "cpu" else 8
