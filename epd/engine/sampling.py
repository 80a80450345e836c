"""Sampling: greedy, temperature, top-k, top-p, reproducible with a seed.

Greedy (temperature 0) is argmax, which is what `generate(do_sample=False)` does, so the oracle
comparison is exact. Filters apply in transformers' order: temperature, then top-k, then top-p.
"""

from __future__ import annotations

import torch

from epd.engine.params import SamplingParams

__all__ = ["Sampler", "SamplingParams", "filter_logits"]


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
