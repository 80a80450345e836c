"""Decode worker configuration: frozen, validated at start-up."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeConfig:
    model_dir: str
    max_running: int = 64  # sequences decoding at once; beyond this Decode is RESOURCE_EXHAUSTED
    pull_timeout_s: float = 30.0
    decode_timeout_s: float = 600.0  # used when the request carries no deadline

    def __post_init__(self) -> None:
        if self.max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {self.max_running}")
        for name in ("pull_timeout_s", "decode_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
