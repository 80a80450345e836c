"""Sampling: greedy, temperature, top-k, top-p, reproducible with a seed.

Greedy (temperature 0) is argmax, which is what `generate(do_sample=False)` does, so the oracle
comparison is exact. Filters apply in transformers' order: temperature, then top-k, then top-p.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop."""

    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means no top-k filter
    seed: int | None = None
    max_tokens: int = 16
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class Sampler:
    """Draws tokens for one request; its own generator makes a seeded request reproducible."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self._generator = torch.Generator()
        if params.seed is not None:
            self._generator.manual_seed(params.seed)
        else:
            self._generator.seed()

    def __call__(self, logits: torch.Tensor) -> int:
        """logits: [V] for the next position -> token id."""
        if self.params.greedy:
            return int(torch.argmax(logits).item())
        probs = torch.softmax(filter_logits(logits.float(), self.params), dim=-1)  # [V]
        return int(torch.multinomial(probs, 1, generator=self._generator).item())


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature-scaled logits [V] with tokens outside top-k / top-p set to -inf."""
    logits = logits / params.temperature
    if 0 < params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)  # [V], [V]
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop a token when the mass before it already reaches top_p; the top token always stays.
        drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits
