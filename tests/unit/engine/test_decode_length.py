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


def test_decode_contexts_read_each_block_table_up_to_its_length_and_the_zero_block_past_it():
    from epd.engine.model_runner import decode_contexts

    slots, mask = decode_contexts([[5, 7, 9], [3]], [20, 3], block_size=16, length=32)
    assert slots.tolist() == [
        list(range(80, 96)) + list(range(112, 116)) + [0] * 12,  # block 9 lies past the length: not read
        [48, 49, 50] + [0] * 29,
    ]
    assert mask.shape == (2, 1, 32)
    assert mask[:, 0].sum(dim=1).tolist() == [20, 3] and mask[0, 0, :20].all() and not mask[0, 0, 20:].any()
    inside, _ = decode_contexts([[2, 6]], [5], block_size=4, length=7)  # ends inside its second block
    assert inside.tolist() == [[8, 9, 10, 11, 24, 0, 0]]  # 25 and 26 are the table's, but unwritten
