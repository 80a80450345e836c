"""Prefill worker configuration: frozen, validated at start-up."""

from __future__ import annotations

from dataclasses import dataclass

from epd.transfer_backends import TRANSFER_BACKENDS


@dataclass(frozen=True)
class PrefillConfig:
    model_dir: str
    transfer_backend: str = "grpc"  # how decode workers pull the KV: grpc | shm | nccl
    embedding_cache_bytes: int = 256 << 20  # local cache of pulled embeddings, by digest
    kv_lease_ttl_s: float = 60.0  # KV not acknowledged by a decode worker is freed after this
    max_prompt_tokens: int = 32768
    pull_timeout_s: float = 30.0
    prefill_timeout_s: float = 120.0  # used when the request carries no deadline

    def __post_init__(self) -> None:
        if self.transfer_backend not in TRANSFER_BACKENDS:
            raise ValueError(f"transfer backend must be one of {TRANSFER_BACKENDS}, got {self.transfer_backend!r}")
        for name in ("embedding_cache_bytes", "max_prompt_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("kv_lease_ttl_s", "pull_timeout_s", "prefill_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
