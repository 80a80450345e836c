"""Fixed-size KV blocks: which block holds which tokens, who shares it, and what may be reused.

Pure Python (no torch): the paged cache holds the tensors, this holds the accounting. Block 0 is
never handed out: it is the zero-filled block that padded attention slots point at.

Prefix reuse: a block full of computed tokens gets a content hash chained from its predecessor's
(token ids, and for image tokens the image digest and offset), so equal prefixes have equal hash
chains. A freed block keeps its hash and sits in an LRU of reusable blocks until its slot is needed
for something else; a new sequence whose leading blocks hash the same takes them instead of
recomputing them. Hits are verified against the stored content, so a hash collision cannot serve
another prompt's KV.
"""

from __future__ import annotations

from collections import OrderedDict

from epd.engine.sequence import Sequence

NULL_BLOCK = 0


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_cache: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"need at least 2 KV blocks (one is reserved), got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_cache = enable_prefix_cache
        self._free: list[int] = list(range(num_blocks - 1, 0, -1))  # never-hashed free blocks; pop() from the end
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, int] = {}  # block -> content hash, for blocks that carry one
        self._content: dict[int, tuple] = {}  # block -> its tokens' content keys (verifies a hash hit)
        self._by_hash: dict[int, int] = {}  # content hash -> block
        self._reusable: OrderedDict[int, None] = OrderedDict()  # ref-0 blocks with a hash, oldest first

    # --- capacity -------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now (never used, or cached but unreferenced)."""
        return len(self._free) + len(self._reusable)

    @property
    def num_used_blocks(self) -> int:
        """Blocks referenced by at least one sequence."""
        return self.num_blocks - 1 - self.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # --- admission ------------------------------------------------------------------------------

    def can_allocate(self, seq: Sequence, reserve: int = 0) -> bool:
        """Whether `allocate(seq)` would succeed and leave `reserve` blocks free."""
        hits = self._prefix_hits(seq)
        needed = self._blocks_at_admission(seq) - len(hits)
        # A hit on a reusable block takes it out of the free count without needing a new one.
        free = self.num_free_blocks - sum(1 for b in hits if self._refs[b] == 0)
        return needed + reserve <= free

    def allocate(self, seq: Sequence) -> None:
        """Give a waiting sequence its blocks: prefix-cache hits first, then fresh ones.

        Sets `num_computed_tokens` (and `num_cached_tokens`) to the tokens the hits cover. A
        non-recomputable sequence gets blocks for its whole lifetime at once: it can never be
        preempted, so it must never need a block the pool cannot give.
        """
        if seq.block_table:
            raise RuntimeError(f"{seq.request_id} already holds blocks")
        if not self.can_allocate(seq):
            raise RuntimeError(f"not enough free KV blocks for {seq.request_id}")
        hits = self._prefix_hits(seq)
        for block in hits:
            self._take(block)
        seq.block_table = list(hits)
        seq.block_hashes = [self._hash_of[b] for b in hits]
        seq.num_cached_tokens = len(hits) * self.block_size
        seq.num_computed_tokens = max(seq.num_computed_tokens, seq.num_cached_tokens)
        for _ in range(self._blocks_at_admission(seq) - len(hits)):
            seq.block_table.append(self._take(self._pop_free()))

    # --- growth ---------------------------------------------------------------------------------

    def can_append(self, seq: Sequence, num_new_tokens: int = 1) -> bool:
        """Whether the sequence's blocks can hold `num_new_tokens` more computed tokens."""
        return self._blocks_short(seq, num_new_tokens) <= self.num_free_blocks

    def append_slots(self, seq: Sequence, num_new_tokens: int = 1) -> None:
        """Add blocks so that `num_computed_tokens + num_new_tokens` tokens fit."""
        short = self._blocks_short(seq, num_new_tokens)
        if short > self.num_free_blocks:
            raise RuntimeError(f"not enough free KV blocks to extend {seq.request_id}")
        for _ in range(short):
            seq.block_table.append(self._take(self._pop_free()))

    def register_full_blocks(self, seq: Sequence) -> None:
        """Hash the blocks that are now full of computed tokens, so later prompts can reuse them."""
        if not (self.enable_prefix_cache and seq.cacheable):
            return
        full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        for index in range(len(seq.block_hashes), full):
            content = seq.block_content(index, self.block_size)
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            digest = hash((parent, content))
            seq.block_hashes.append(digest)
            block = seq.block_table[index]
            if digest not in self._by_hash and block not in self._hash_of:
                self._by_hash[digest] = block
                self._hash_of[block] = digest
                self._content[block] = content

    # --- release --------------------------------------------------------------------------------

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references; unshared blocks become free (hashed ones stay reusable)."""
        for block in reversed(seq.block_table):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if block in self._hash_of:
                    self._reusable[block] = None
                else:
                    self._free.append(block)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    # --- internals ------------------------------------------------------------------------------

    def _blocks_at_admission(self, seq: Sequence) -> int:
        tokens = seq.num_tokens if seq.recomputable else seq.max_total_tokens
        return self.blocks_for(tokens)

    def _blocks_short(self, seq: Sequence, num_new_tokens: int) -> int:
        return max(self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table), 0)

    def _prefix_hits(self, seq: Sequence) -> list[int]:
        """Leading blocks already cached. At least one prompt token is always left to compute (its
        logits give the next token), so a prompt that fills its last block exactly skips that one."""
        if not (self.enable_prefix_cache and seq.cacheable) or seq.num_computed_tokens:
            return []
        hits: list[int] = []
        parent = None
        for index in range((seq.num_tokens - 1) // self.block_size):
            content = seq.block_content(index, self.block_size)
            digest = hash((parent, content))
            block = self._by_hash.get(digest)
            if block is None or self._content[block] != content:
                break
            hits.append(block)
            parent = digest
        return hits

    def _pop_free(self) -> int:
        if self._free:
            return self._free.pop()
        block, _ = self._reusable.popitem(last=False)  # evict the least recently freed cached block
        digest = self._hash_of.pop(block)
        del self._by_hash[digest]
        del self._content[block]
        return block

    def _take(self, block: int) -> int:
        if self._refs[block] == 0:
            self._reusable.pop(block, None)
        self._refs[block] += 1
        return block
