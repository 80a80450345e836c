"""Placeholder expansion: one image placeholder per image becomes `count` tokens."""

from __future__ import annotations

import pytest

from epd.engine.placeholders import expand_placeholders, image_token_mask

IMG = 99


def test_no_images_leaves_ids_unchanged():
    ids, starts = expand_placeholders([1, 2, 3], IMG, [])
    assert ids == [1, 2, 3]
    assert starts == []


def test_one_image_expands_in_place():
    ids, starts = expand_placeholders([1, 2, IMG, 3], IMG, [4])
    assert ids == [1, 2, IMG, IMG, IMG, IMG, 3]
    assert starts == [2]


def test_two_images_with_different_counts():
    ids, starts = expand_placeholders([5, IMG, 6, 7, IMG, 8], IMG, [3, 2])
    assert ids == [5, IMG, IMG, IMG, 6, 7, IMG, IMG, 8]
    # second start is shifted by the first image's extra tokens
    assert starts == [1, 6]


def test_adjacent_images_at_start_and_end():
    ids, starts = expand_placeholders([IMG, IMG], IMG, [1, 3])
    assert ids == [IMG, IMG, IMG, IMG]
    assert starts == [0, 1]


def test_count_of_one_is_identity():
    ids, starts = expand_placeholders([IMG, 4], IMG, [1])
    assert ids == [IMG, 4]
    assert starts == [0]


def test_accepts_tuples():
    ids, starts = expand_placeholders((7, IMG), IMG, (2,))
    assert ids == [7, IMG, IMG]
    assert starts == [1]


@pytest.mark.parametrize(
    ("token_ids", "counts", "found", "given"),
    [
        ([1, IMG, 2], [], 1, 0),
        ([1, IMG, 2], [2, 3], 1, 2),
        ([1, 2], [4], 0, 1),
        ([IMG, IMG, IMG], [1, 1], 3, 2),
    ],
)
def test_count_mismatch_raises(token_ids, counts, found, given):
    with pytest.raises(ValueError) as excinfo:
        expand_placeholders(token_ids, IMG, counts)
    assert str(excinfo.value) == f"prompt has {found} image placeholders but {given} images were given"


@pytest.mark.parametrize("counts", [[0], [3, 0], [-1, 2]])
def test_non_positive_count_raises(counts):
    token_ids = [IMG] * len(counts)
    with pytest.raises(ValueError) as excinfo:
        expand_placeholders(token_ids, IMG, counts)
    assert str(excinfo.value) == f"every image must produce at least one token, got counts {counts}"


def test_image_token_mask():
    assert image_token_mask([1, IMG, IMG, 2, IMG], IMG) == [0, 1, 1, 0, 1]
    assert image_token_mask([1, 2], IMG) == [0, 0]
    assert image_token_mask([], IMG) == []


def test_mask_of_expanded_prompt_counts_image_tokens():
    ids, _ = expand_placeholders([1, IMG, 2, IMG], IMG, [3, 2])
    assert image_token_mask(ids, IMG) == [0, 1, 1, 1, 0, 1, 1]
