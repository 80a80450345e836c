"""The decodes' common context length: rounded up only where the product kernels are built per shape."""

from __future__ import annotations

import torch

from epd.engine.model_runner import decode_length_step
from epd.models.shape_buckets import round_up


def test_reduced_precision_on_a_cpu_rounds_to_16_and_everything_else_keeps_the_exact_length():
    cpu = torch.device("cpu")
    assert decode_length_step(torch.bfloat16, cpu) == 16
    assert decode_length_step(torch.float16, cpu) == 16
    assert decode_length_step(torch.float32, cpu) == 1  # MKL: no kernel built per shape
    assert decode_length_step(torch.bfloat16, torch.device("cuda")) == 1


def test_round_up_keeps_multiples_and_lifts_the_rest_to_the_next_one():
    assert [round_up(n, 16) for n in (0, 1, 15, 16, 17, 353)] == [0, 16, 16, 16, 32, 368]
    assert [round_up(n, 1) for n in (0, 7, 353)] == [0, 7, 353]
