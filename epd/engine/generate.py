"""The decode loop: sample, check stop conditions, step. Shared by the in-process path and its tests."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from epd.engine.sampling import Sampler, SamplingParams


@dataclass(frozen=True)
class Generation:
    """Generated token ids and why generation ended ("stop": an EOS id, "length": max_tokens)."""

    token_ids: list[int]
    finish_reason: str


def decode_loop(
    first_logits: torch.Tensor,
    step: Callable[[int], torch.Tensor],
    params: SamplingParams,
    eos_token_ids: Iterable[int],
) -> Generation:
    """Sample from first_logits [V], then call step(token) -> next logits [V] until a stop condition."""
    sampler = Sampler(params)
    eos = set() if params.ignore_eos else set(eos_token_ids)
    tokens: list[int] = []
    logits = first_logits
    while True:
        token = sampler(logits)
        tokens.append(token)
        if token in eos:
            return Generation(tokens, "stop")
        if len(tokens) >= params.max_tokens:
            return Generation(tokens, "length")
        logits = step(token)
