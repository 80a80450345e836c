"""A step's positions packed from its decodes' columns of ints and its chunks' tensors
(epd.engine.model_runner.packed_positions, PositionPlan.column): equal to each token's own
positions from its plan, for 1-D rope and M-RoPE, a one-token prompt chunk included. Model-free."""

from __future__ import annotations

import torch

from epd.engine.model_runner import SequenceInputs, packed_positions
from epd.engine.positions import mrope_plan, text_plan


def _inputs(plan) -> SequenceInputs:
    return SequenceInputs(plan=plan, images=[], sampler=None)


def _one_by_one(items) -> torch.Tensor:
    """What the step packed before: each item's positions from its plan, concatenated."""
    return torch.cat([_inputs(plan).positions(start, stop) for plan, start, stop in items], dim=-1)


def _packed(items) -> torch.Tensor:
    decodes = [plan.column(start) for plan, start, stop in items if stop - start == 1]
    chunks = [_inputs(plan).positions(start, stop) for plan, start, stop in items if stop - start > 1]
    return packed_positions(decodes, chunks)


def test_column_is_the_plans_position_on_each_row_in_the_prompt_and_after():
    image = mrope_plan(11, [(3, (1, 4, 6))], spatial_merge=2)  # image tokens at 3..8, delta -3
    assert image.column(4) == [3, 3, 4] and image.column(10) == [7, 7, 7]  # in the prompt
    assert image.column(11) == [8, 8, 8] and image.column(20) == [17, 17, 17]  # decodes
    assert text_plan(5).column(2) == [2] and text_plan(5).column(9) == [9]


def test_1d_decodes_then_chunks_equal_their_own_positions():
    a, b = text_plan(5), text_plan(30)
    items = [(a, 7, 8), (b, 30, 31), (b, 4, 5), (a, 0, 5), (b, 10, 20)]  # b, 4..5: a one-token prompt chunk
    got = _packed(items)
    assert got.shape == (1 + 1 + 1 + 5 + 10,) and got.dtype == torch.long
    assert torch.equal(got, _one_by_one(items))


def test_mrope_decodes_then_chunks_equal_their_own_positions():
    image = mrope_plan(11, [(3, (1, 4, 6))], spatial_merge=2)
    text = mrope_plan(6, [], spatial_merge=2)
    items = [(image, 12, 13), (image, 5, 6), (text, 6, 7), (image, 0, 9), (text, 2, 6)]  # 5..6: an image token
    got = _packed(items)
    assert got.shape == (3, 3 + 9 + 4) and got.dtype == torch.long
    assert torch.equal(got, _one_by_one(items))


def test_decodes_alone_and_chunks_alone():
    image = mrope_plan(11, [(3, (1, 4, 6))], spatial_merge=2)
    decodes = [(image, 11, 12), (image, 14, 15)]
    assert packed_positions([p.column(s) for p, s, _ in decodes], []).tolist() == [[8, 11], [8, 11], [8, 11]]
    assert packed_positions([[7], [3]], []).tolist() == [7, 3]
    chunk = [(image, 0, 11)]
    assert torch.equal(_packed(chunk), image.prefill)
