"""BlockManager on exact numbers: allocation, growth, release, prefix reuse, eviction."""

from __future__ import annotations

import random

import pytest

from epd.engine.block_manager import NULL_BLOCK, BlockManager
from epd.engine.sequence import ImageSpan
from tests.unit.engine.helpers import check_invariants, seq


def test_the_null_block_is_reserved():
    blocks = BlockManager(num_blocks=5, block_size=4)
    assert blocks.num_free_blocks == 4
    s = seq("a", 16)
    blocks.allocate(s)
    assert NULL_BLOCK not in s.block_table
    assert blocks.num_free_blocks == 0


def test_allocate_gives_blocks_for_the_whole_prompt():
    blocks = BlockManager(num_blocks=10, block_size=4)
    s = seq("a", 9)
    assert blocks.can_allocate(s)
    blocks.allocate(s)
    assert len(s.block_table) == 3  # ceil(9 / 4)
    assert blocks.num_used_blocks == 3 and blocks.num_free_blocks == 6
    assert s.num_computed_tokens == 0


def test_can_allocate_counts_the_reserve():
    blocks = BlockManager(num_blocks=4, block_size=4)  # 3 usable
    assert blocks.can_allocate(seq("a", 12))
    assert not blocks.can_allocate(seq("a", 12), reserve=1)
    assert not blocks.can_allocate(seq("b", 13))


def test_allocate_refuses_when_short():
    blocks = BlockManager(num_blocks=3, block_size=4)
    with pytest.raises(RuntimeError, match="not enough free KV blocks"):
        blocks.allocate(seq("a", 9))
    assert blocks.num_free_blocks == 2


def test_a_non_recomputable_sequence_gets_its_lifetime_at_once():
    blocks = BlockManager(num_blocks=10, block_size=4)
    s = seq("a", 5, max_tokens=8, recomputable=False, cacheable=False)
    s.num_computed_tokens = 5
    blocks.allocate(s)
    assert len(s.block_table) == 4  # ceil((5 + 8) / 4)
    assert s.num_computed_tokens == 5
    for _ in range(8):
        assert blocks.can_append(s)
        blocks.append_slots(s)
        s.num_computed_tokens += 1
    assert len(s.block_table) == 4


def test_append_needs_a_block_only_at_a_boundary():
    blocks = BlockManager(num_blocks=4, block_size=4)
    s = seq("a", 4)
    blocks.allocate(s)
    s.num_computed_tokens = 4
    assert blocks._blocks_short(s, 1) == 1
    blocks.append_slots(s)
    assert len(s.block_table) == 2
    s.num_computed_tokens = 5
    blocks.append_slots(s, 3)  # tokens 5..7 fit in block 2
    assert len(s.block_table) == 2
    assert blocks.can_append(s, 4) and not blocks.can_append(s, 8)  # 1 free block left
    with pytest.raises(RuntimeError, match="not enough free KV blocks"):
        blocks.append_slots(s, 8)


def test_free_returns_every_block():
    blocks = BlockManager(num_blocks=8, block_size=4, enable_prefix_cache=False)
    a, b = seq("a", 9), seq("b", 3)
    blocks.allocate(a)
    blocks.allocate(b)
    assert blocks.num_free_blocks == 3
    blocks.free(a)
    assert blocks.num_free_blocks == 6 and a.block_table == [] and a.num_computed_tokens == 0
    blocks.free(b)
    assert blocks.num_free_blocks == 7 and blocks.num_used_blocks == 0


def _computed(blocks: BlockManager, s) -> None:
    """Pretend the whole prompt was computed and register its full blocks."""
    s.num_computed_tokens = s.num_tokens
    blocks.register_full_blocks(s)


def test_a_repeated_prompt_reuses_its_full_blocks():
    blocks = BlockManager(num_blocks=10, block_size=4)
    a = seq("a", 10)
    blocks.allocate(a)
    _computed(blocks, a)
    assert len(a.block_hashes) == 2  # tokens 0..7; the third block holds 2 tokens
    b = seq("b", 10)
    blocks.allocate(b)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert b.num_cached_tokens == 8 and b.num_computed_tokens == 8
    assert blocks.num_used_blocks == 4  # 2 shared + 1 each
    check_invariants(blocks, [a, b])


def test_a_prompt_filling_its_last_block_recomputes_that_block():
    blocks = BlockManager(num_blocks=10, block_size=4)
    a = seq("a", 8)
    blocks.allocate(a)
    _computed(blocks, a)
    b = seq("b", 8)
    blocks.allocate(b)
    assert b.num_cached_tokens == 4  # one token must be computed for the next token's logits


def test_prefix_hits_stop_at_the_first_difference():
    blocks = BlockManager(num_blocks=10, block_size=4)
    a = seq("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    blocks.allocate(a)
    _computed(blocks, a)
    b = seq("b", [1, 2, 3, 4, 5, 6, 0, 8, 9])
    blocks.allocate(b)
    assert b.num_cached_tokens == 4 and b.block_table[0] == a.block_table[0]


def test_image_tokens_hash_by_digest_not_by_placeholder_id():
    image_a, image_b = (ImageSpan(1, 4, "digest-a"),), (ImageSpan(1, 4, "digest-b"),)
    blocks = BlockManager(num_blocks=10, block_size=4)
    prompt = [1, 9, 9, 9, 9, 2, 3, 4, 5]  # 9 = image placeholder
    a = seq("a", prompt, images=image_a)
    blocks.allocate(a)
    _computed(blocks, a)
    same = seq("same", prompt, images=image_a)
    other = seq("other", prompt, images=image_b)
    blocks.allocate(same)
    blocks.allocate(other)
    assert same.num_cached_tokens == 8
    assert other.num_cached_tokens == 0


def test_freed_hashed_blocks_stay_reusable_until_evicted_oldest_first():
    blocks = BlockManager(num_blocks=6, block_size=4)  # 5 usable
    a = seq("a", [1] * 8 + [2])
    blocks.allocate(a)
    _computed(blocks, a)
    cached = a.block_table[:2]
    blocks.free(a)
    assert blocks.num_free_blocks == 5
    again = seq("again", [1] * 8 + [3])
    blocks.allocate(again)
    assert again.block_table[:2] == cached and again.num_cached_tokens == 8
    blocks.free(again)
    # Take all five blocks: the never-hashed ones go first, then the cached ones, oldest freed first.
    hog = seq("hog", 20, cacheable=False)
    blocks.allocate(hog)
    assert blocks.num_free_blocks == 0
    blocks.free(hog)
    late = seq("late", [1] * 8 + [2])
    blocks.allocate(late)
    assert late.num_cached_tokens == 0  # evicted by the hog


def test_a_hash_hit_with_other_content_is_not_served():
    blocks = BlockManager(num_blocks=10, block_size=2)
    a = seq("a", [5, 6, 7])
    blocks.allocate(a)
    _computed(blocks, a)
    [block] = a.block_table[:1]
    blocks._content[block] = (8, 9)  # as if another prompt had collided on the same hash
    b = seq("b", [5, 6, 7])
    blocks.allocate(b)
    assert b.num_cached_tokens == 0


def test_uncacheable_sequences_neither_register_nor_hit():
    blocks = BlockManager(num_blocks=10, block_size=4)
    a = seq("a", 9, cacheable=False)
    blocks.allocate(a)
    _computed(blocks, a)
    assert a.block_hashes == []
    b = seq("b", 9)
    blocks.allocate(b)
    assert b.num_cached_tokens == 0


def test_randomized_allocations_never_leak_or_double_count():
    rng = random.Random(5)
    blocks = BlockManager(num_blocks=40, block_size=4)
    live = []
    for step in range(600):
        action = rng.random()
        if action < 0.4:
            s = seq(f"s{step}", [rng.randrange(3) for _ in range(rng.randrange(1, 20))])
            if blocks.can_allocate(s):
                blocks.allocate(s)
                live.append(s)
        elif action < 0.7 and live:
            s = rng.choice(live)
            s.num_computed_tokens = s.num_tokens
            blocks.register_full_blocks(s)
            if blocks.can_append(s):
                blocks.append_slots(s)
                s.token_ids.append(rng.randrange(3))
        elif live:
            s = live.pop(rng.randrange(len(live)))
            blocks.free(s)
        check_invariants(blocks, live)
    for s in live:
        blocks.free(s)
    assert blocks.num_used_blocks == 0 and blocks.num_free_blocks == 39
