"""Model-free sequences for scheduler and block manager tests."""

from __future__ import annotations

from epd.engine.block_manager import BlockManager
from epd.engine.params import SamplingParams
from epd.engine.sequence import ImageSpan, Sequence


def seq(name: str, prompt: int | list[int], max_tokens: int = 8, *, images: tuple[ImageSpan, ...] = (),
        stop: frozenset[int] = frozenset(), handoff: bool = False, recomputable: bool = True,
        cacheable: bool = True) -> Sequence:
    """A sequence whose prompt is `prompt` tokens (ids 100, 101, ... unless a list is given)."""
    ids = list(prompt) if isinstance(prompt, list) else [100 + i for i in range(prompt)]
    return Sequence(request_id=name, token_ids=ids, num_prompt_tokens=len(ids),
                    params=SamplingParams(max_tokens=max_tokens), stop_token_ids=stop, images=images,
                    handoff=handoff, recomputable=recomputable, cacheable=cacheable)


def check_invariants(blocks: BlockManager, live: list[Sequence]) -> None:
    """Every block is free or referenced exactly as often as live sequences hold it; the null block never is."""
    refs = [0] * blocks.num_blocks
    for s in live:
        for b in s.block_table:
            refs[b] += 1
    assert refs[0] == 0, "the null block was handed out"
    assert refs == blocks._refs, "reference counts disagree with the sequences' block tables"
    held = sum(1 for r in refs[1:] if r)
    assert held == blocks.num_used_blocks
    assert held + blocks.num_free_blocks == blocks.num_blocks - 1
