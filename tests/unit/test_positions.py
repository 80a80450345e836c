"""Position plans: 1-D text positions and Qwen-style M-RoPE, from counts and grids only."""

from __future__ import annotations

import random

import pytest
import torch

from epd.engine.positions import PositionPlan, merged_grid, mrope_plan, text_plan


def _eq(actual: torch.Tensor, expected: list) -> None:
    assert actual.dtype == torch.long
    assert actual.tolist() == expected


# --- text_plan -------------------------------------------------------------------------------


def test_text_plan_prefill_and_delta():
    plan = text_plan(5)
    _eq(plan.prefill, [0, 1, 2, 3, 4])
    assert plan.delta == 0
    assert plan.rows == 1


def test_text_plan_decode_continues_at_index():
    plan = text_plan(5)
    _eq(plan.decode_positions(5), [5])
    _eq(plan.decode_positions(7, count=3), [7, 8, 9])


def test_text_plan_empty():
    plan = text_plan(0)
    _eq(plan.prefill, [])
    assert plan.delta == 0


# --- merged_grid -----------------------------------------------------------------------------


def test_merged_grid():
    assert merged_grid((1, 4, 6), 2) == (1, 2, 3)
    assert merged_grid((2, 6, 3), 3) == (2, 2, 1)
    assert merged_grid((1, 5, 7), 1) == (1, 5, 7)


@pytest.mark.parametrize("grid", [(1, 3, 4), (1, 4, 5), (1, 5, 5)])
def test_merged_grid_not_divisible(grid):
    with pytest.raises(ValueError, match="not divisible by spatial merge size 2"):
        merged_grid(grid, 2)


# --- mrope_plan: hand-worked examples ----------------------------------------------------------


def test_mrope_text_only_matches_text_positions():
    plan = mrope_plan(4, [], spatial_merge=2)
    _eq(plan.prefill, [[0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3]])
    assert plan.delta == 0
    assert plan.rows == 3
    _eq(plan.decode_positions(4), [[4], [4], [4]])


def test_mrope_one_image_hand_worked():
    # 3 text tokens, an image with grid (1, 4, 6) merged by 2 -> 1x2x3 = 6 tokens at 3..8, 2 text tokens.
    plan = mrope_plan(11, [(3, (1, 4, 6))], spatial_merge=2)
    _eq(
        plan.prefill,
        [
            [0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7],
            [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7],
            [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7],
        ],
    )
    assert plan.delta == 8 - 11
    _eq(plan.decode_positions(11), [[8], [8], [8]])
    _eq(plan.decode_positions(12, count=2), [[9, 10], [9, 10], [9, 10]])


def test_mrope_tall_image_jumps_by_height():
    # grid (1, 6, 2) / 2 -> h=3, w=1: 3 tokens; the running position jumps by max(3, 1) = 3.
    plan = mrope_plan(5, [(1, (1, 6, 2))], spatial_merge=2)
    _eq(
        plan.prefill,
        [
            [0, 1, 1, 1, 4],
            [0, 1, 2, 3, 4],
            [0, 1, 1, 1, 4],
        ],
    )
    assert plan.delta == 5 - 5


def test_mrope_two_images():
    # text 0..1, image A (1,4,4)/2 -> 2x2 = 4 tokens at 2..5, text 1 token, image B (1,2,4)/2 -> 1x2 at 7..8,
    # text 1 token.
    plan = mrope_plan(10, [(2, (1, 4, 4)), (7, (1, 2, 4))], spatial_merge=2)
    # A occupies positions 2 + grid; next position 2 + 2 = 4; text at 6 -> 4; B starts at 5, w in 5..6;
    # after B position 5 + max(1, 2) = 7.
    _eq(
        plan.prefill,
        [
            [0, 1, 2, 2, 2, 2, 4, 5, 5, 7],
            [0, 1, 2, 2, 3, 3, 4, 5, 5, 7],
            [0, 1, 2, 3, 2, 3, 4, 5, 6, 7],
        ],
    )
    assert plan.delta == 8 - 10
    _eq(plan.decode_positions(10), [[8], [8], [8]])


def test_mrope_images_given_out_of_order_are_sorted():
    in_order = mrope_plan(10, [(2, (1, 4, 4)), (7, (1, 2, 4))], spatial_merge=2)
    reversed_ = mrope_plan(10, [(7, (1, 2, 4)), (2, (1, 4, 4))], spatial_merge=2)
    assert torch.equal(in_order.prefill, reversed_.prefill)
    assert in_order.delta == reversed_.delta


def test_mrope_image_at_position_zero():
    # image (1,2,4)/2 -> 1x2 tokens at 0..1, then 2 text tokens from position max(1,2) = 2.
    plan = mrope_plan(4, [(0, (1, 2, 4))], spatial_merge=2)
    _eq(
        plan.prefill,
        [
            [0, 0, 2, 3],
            [0, 0, 2, 3],
            [0, 1, 2, 3],
        ],
    )
    assert plan.delta == 4 - 4


def test_mrope_image_at_end_of_prompt():
    # 2 text tokens, image (1,4,4)/2 -> 2x2 tokens at 2..5 ending the prompt.
    plan = mrope_plan(6, [(2, (1, 4, 4))], spatial_merge=2)
    _eq(
        plan.prefill,
        [
            [0, 1, 2, 2, 2, 2],
            [0, 1, 2, 2, 3, 3],
            [0, 1, 2, 3, 2, 3],
        ],
    )
    # max is 3 -> delta = 4 - 6; decode continues at max + 1 on every row.
    assert plan.delta == -2
    _eq(plan.decode_positions(6), [[4], [4], [4]])


def test_mrope_adjacent_images():
    # two images back to back: A (1,2,2)/2 -> 1 token at 0, B (1,2,2)/2 -> 1 token at 1.
    plan = mrope_plan(2, [(0, (1, 2, 2)), (1, (1, 2, 2))], spatial_merge=2)
    _eq(plan.prefill, [[0, 1], [0, 1], [0, 1]])
    assert plan.delta == 0


def test_mrope_temporal_grid():
    # t=2, (4,2)/2 -> h=2, w=1: 4 tokens, t row 0,0,1,1 offset by 1.
    plan = mrope_plan(6, [(1, (2, 4, 2))], spatial_merge=2)
    _eq(
        plan.prefill,
        [
            [0, 1, 1, 2, 2, 3],
            [0, 1, 2, 1, 2, 3],
            [0, 1, 1, 1, 1, 3],
        ],
    )
    assert plan.delta == 4 - 6


# --- mrope_plan: errors ----------------------------------------------------------------------


def test_mrope_overlapping_spans():
    # first image covers tokens 0..3; the second starts at 2.
    with pytest.raises(ValueError, match="image at token 2 overlaps the previous image \\(ends at 4\\)"):
        mrope_plan(10, [(0, (1, 4, 4)), (2, (1, 2, 2))], spatial_merge=2)


def test_mrope_span_past_the_end():
    # image at 2 with 4 tokens ends at 6 > 5.
    with pytest.raises(ValueError, match="image tokens run to index 6, past the prompt's 5 tokens"):
        mrope_plan(5, [(2, (1, 4, 4))], spatial_merge=2)


def test_mrope_span_exactly_to_the_end_is_fine():
    plan = mrope_plan(6, [(2, (1, 4, 4))], spatial_merge=2)
    assert plan.prefill.shape == (3, 6)


def test_mrope_grid_not_divisible():
    with pytest.raises(ValueError, match="not divisible"):
        mrope_plan(10, [(0, (1, 3, 4))], spatial_merge=2)


# --- PositionPlan ----------------------------------------------------------------------------


def test_decode_positions_returns_independent_tensor():
    plan = PositionPlan(prefill=torch.zeros(3, 2, dtype=torch.long), delta=5)
    pos = plan.decode_positions(2, count=2)
    pos[0, 0] = -1  # must not alias the other rows
    _eq(pos, [[-1, 8], [7, 8], [7, 8]])


# --- property check against an independent reimplementation ----------------------------------


def _reference_rope_index(token_types: list[int], grids: list[tuple[int, int, int]], merge: int):
    """Qwen3-VL get_rope_index, token by token: (positions [3][L] as lists, delta)."""
    rows: list[list[int]] = [[], [], []]
    current = 0
    grid_iter = iter(grids)
    i = 0
    n = len(token_types)
    while i < n:
        if token_types[i] == 0:
            for r in rows:
                r.append(current)
            current += 1
            i += 1
            continue
        t, h, w = next(grid_iter)
        lh, lw = h // merge, w // merge
        for ti in range(t):
            for hi in range(lh):
                for wi in range(lw):
                    rows[0].append(current + ti)
                    rows[1].append(current + hi)
                    rows[2].append(current + wi)
        i += t * lh * lw
        current += max(h, w) // merge
    highest = max(max(r) for r in rows) if n else -1
    return rows, highest + 1 - n if n else 0


@pytest.mark.parametrize("seed", range(40))
def test_mrope_matches_reference(seed):
    rng = random.Random(seed)
    merge = rng.choice([1, 2])
    types: list[int] = []
    spans = []
    grids = []
    for _ in range(rng.randint(0, 3)):
        types.extend([0] * rng.randint(1, 4))  # text keeps images apart, as vision_start/end tokens do
        grid = (rng.randint(1, 2), merge * rng.randint(1, 4), merge * rng.randint(1, 4))
        spans.append((len(types), grid))
        grids.append(grid)
        types.extend([1] * (grid[0] * (grid[1] // merge) * (grid[2] // merge)))
    types.extend([0] * rng.randint(0, 4))

    plan = mrope_plan(len(types), spans, spatial_merge=merge)
    expected_rows, expected_delta = _reference_rope_index(types, grids, merge)
    assert plan.prefill.shape == (3, len(types))
    assert plan.prefill.tolist() == expected_rows
    assert plan.delta == expected_delta
    _eq(plan.decode_positions(len(types)), [[len(types) + expected_delta]] * 3)
