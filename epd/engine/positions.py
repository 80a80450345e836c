"""Position ids per family, computed from token counts and image grids alone (no model, no pixels).

Kimi-K2.5 numbers tokens 0..L-1. Qwen3-VL uses M-RoPE: three rows (temporal, height, width); text
tokens advance all three together, an image block of a (t, h, w) merged grid gets its grid
coordinates offset by the running position, and the running position then jumps by max(h, w).
Decode steps continue at `absolute index + delta`, on every row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# (index of the image's first placeholder token, (t, h, w) patch grid before spatial merge)
ImageSpan = tuple[int, tuple[int, int, int]]


@dataclass(frozen=True)
class PositionPlan:
    """Prefill positions and the offset that later (decode) tokens add to their absolute index."""

    prefill: torch.Tensor  # [L] for 1-D rope, [3, L] for M-RoPE
    delta: int

    @property
    def rows(self) -> int:
        return 1 if self.prefill.ndim == 1 else self.prefill.shape[0]

    def column(self, index: int) -> list[int]:
        """Token `index`'s position on each row (one row for 1-D rope, three for M-RoPE), as ints: a
        decode step packs its decodes' positions from these into one tensor, not a tensor each."""
        if index < self.prefill.shape[-1]:
            value = self.prefill[..., index].tolist()
            return value if isinstance(value, list) else [value]
        return [index + self.delta] * self.rows

    def decode_positions(self, start: int, count: int = 1) -> torch.Tensor:
        """Positions of tokens at absolute indices start..start+count-1: [count] or [rows, count]."""
        pos = torch.arange(start, start + count, dtype=torch.long) + self.delta  # [count]
        return pos if self.rows == 1 else pos.expand(self.rows, count).clone()


def text_plan(num_tokens: int) -> PositionPlan:
    """Plain 1-D positions 0..L-1."""
    return PositionPlan(prefill=torch.arange(num_tokens, dtype=torch.long), delta=0)


def merged_grid(grid_thw: tuple[int, int, int], spatial_merge: int) -> tuple[int, int, int]:
    """(t, h, w) in language tokens: spatial dims divided by the merge size."""
    t, h, w = grid_thw
    if h % spatial_merge or w % spatial_merge:
        raise ValueError(f"grid {grid_thw} is not divisible by spatial merge size {spatial_merge}")
    return t, h // spatial_merge, w // spatial_merge


def mrope_plan(num_tokens: int, images: list[ImageSpan], spatial_merge: int) -> PositionPlan:
    """M-RoPE positions [3, L] for a prompt whose images start at the given token indices."""
    pieces: list[torch.Tensor] = []  # each [3, n]
    cursor = 0  # next token index
    position = 0  # running position id
    for start, grid in sorted(images):
        if start < 0:
            raise ValueError(f"image start index must be >= 0, got {start}")
        if start < cursor:
            raise ValueError(f"image at token {start} overlaps the previous image (ends at {cursor})")
        pieces.append(_text_rows(position, start - cursor))
        position += start - cursor
        t, h, w = merged_grid(grid, spatial_merge)
        pieces.append(_grid_rows(position, t, h, w))
        position += max(h, w)
        cursor = start + t * h * w
    if cursor > num_tokens:
        raise ValueError(f"image tokens run to index {cursor}, past the prompt's {num_tokens} tokens")
    pieces.append(_text_rows(position, num_tokens - cursor))
    prefill = torch.cat(pieces, dim=1)  # [3, L]
    delta = int(prefill.max().item()) + 1 - num_tokens if num_tokens else 0
    return PositionPlan(prefill=prefill, delta=delta)


def _text_rows(start: int, count: int) -> torch.Tensor:
    return (torch.arange(count, dtype=torch.long) + start).expand(3, count)  # [3, count]


def _grid_rows(start: int, t: int, h: int, w: int) -> torch.Tensor:
    tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack([tt, hh, ww]).reshape(3, -1).long() + start  # [3, t*h*w]
