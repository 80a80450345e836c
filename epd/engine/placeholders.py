"""Placeholder expansion: one image token in the rendered prompt becomes N tokens, N from the encoder.

The chat template writes a single placeholder per image; only the encoder (which owns the image
processor) knows how many language tokens an image becomes. The language side expands with that
count, so it never needs the processor or the pixels.
"""

from __future__ import annotations

from collections.abc import Sequence


def expand_placeholders(
    token_ids: Sequence[int], image_token_id: int, counts: Sequence[int]
) -> tuple[list[int], list[int]]:
    """Repeat the k-th image placeholder counts[k] times; return (expanded ids, each image's start index)."""
    found = sum(1 for t in token_ids if t == image_token_id)
    if found != len(counts):
        raise ValueError(f"prompt has {found} image placeholders but {len(counts)} images were given")
    if any(c <= 0 for c in counts):
        raise ValueError(f"every image must produce at least one token, got counts {list(counts)}")
    expanded: list[int] = []
    starts: list[int] = []
    images = iter(counts)
    for token in token_ids:
        if token == image_token_id:
            starts.append(len(expanded))
            expanded.extend([image_token_id] * next(images))
        else:
            expanded.append(token)
    return expanded, starts


def image_token_mask(token_ids: Sequence[int], image_token_id: int) -> list[int]:
    """1 where a token is an image placeholder, else 0 (Qwen3-VL's `mm_token_type_ids`)."""
    return [1 if t == image_token_id else 0 for t in token_ids]
