"""One forward for everything the scheduler picked: pack, run, sample.

The scheduled sequences become ONE `[1, T]` row (single-token decodes first, then prefill
chunks), with per-token positions from each sequence's plan, the image embedding rows that fall in
each chunk, the pool slots to write, and the contexts to read (`StepLayout`). `logits_to_keep` is
the index of each sampling sequence's last token, so the LM head runs on those rows only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from epd.engine import last_layer, onednn_linear
from epd.engine.attention import PrefillSegment, StepLayout, causal_chunk_mask
from epd.engine.direct_decode import DirectDecode
from epd.engine.paged_cache import NamedTensors, PagedKVCache
from epd.engine.positions import PositionPlan
from epd.engine.sampling import Sampler
from epd.engine.scheduler import Scheduled
from epd.engine.sequence import Sequence
from epd.models.loading import LanguageModel
from epd.models.registry import ImageTensors
from epd.models.shape_buckets import pads_rows, round_up


@dataclass
class SequenceInputs:
    """What the runner keeps per sequence: positions, image embeddings (aligned with seq.images), sampler."""

    plan: PositionPlan
    images: list[ImageTensors]
    sampler: Sampler

    def positions(self, start: int, stop: int) -> torch.Tensor:
        """Positions of tokens [start, stop): [n] (1-D rope) or [rows, n] (M-RoPE)."""
        prompt = self.plan.prefill.shape[-1]
        parts = []
        if start < prompt:
            parts.append(self.plan.prefill[..., start:min(stop, prompt)])
        if stop > prompt:
            first = max(start, prompt)
            parts.append(self.plan.decode_positions(first, stop - first))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


@dataclass
class _Batch:
    ids: list[int]
    positions: list[torch.Tensor]  # prefill chunks' positions (the decodes' are in decode_columns)
    slots: list[torch.Tensor]  # prefill chunks' slots to write (the decodes' come from their contexts)
    contexts: list[torch.Tensor]  # prefill chunks' contexts to read
    images: list[ImageTensors]
    keep: list[int]
    samplers: list[tuple[Sequence, Sampler]]
    # One-token items (decodes), packed from their block tables in one go rather than a tensor each
    decode_tables: list[list[int]] = field(default_factory=list)  # each one's block table
    decode_lengths: list[int] = field(default_factory=list)  # its context, the new token included
    decode_columns: list[list[int]] = field(default_factory=list)  # its position on each row


def packed_positions(decode_columns: list[list[int]], chunks: list[torch.Tensor]) -> torch.Tensor:
    """A step's positions, [T] (1-D rope) or [rows, T] (M-RoPE): its decodes' first, from their
    columns of ints in one tensor (a tensor per decode, then their cat: 212 against 30 us for 32
    decodes with 1-D rope, 420 against 42 with M-RoPE), then its prefill chunks' ([n] or [rows, n]); pure."""
    if not decode_columns:
        return torch.cat(chunks, dim=-1)  # a copy, never a view of a plan
    columns = torch.tensor(decode_columns, dtype=torch.long)  # [n, rows]
    decodes = columns[:, 0] if columns.shape[1] == 1 else columns.t()  # one row: 1-D rope
    return torch.cat([decodes, *chunks], dim=-1)


def decode_contexts(tables: list[list[int]], lengths: list[int], block_size: int,
                    length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pool slots [n, length] of each decode's context, slot 0 (the zero block) past its end, and the
    mask [n, 1, length] (True: attend); pure. `length` >= every one of `lengths`."""
    blocks = -(-length // block_size)
    table = torch.tensor([(t + [0] * blocks)[:blocks] for t in tables], dtype=torch.long)  # [n, B]
    slots = (table[:, :, None] * block_size + torch.arange(block_size)).view(len(tables), -1)[:, :length]
    mask = torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]  # [n, L]
    # Past the end the block table's own slots may hold anything (never written, or another
    # sequence's old tokens): the zero block keeps masked-out products finite (0 x NaN is NaN).
    return slots.masked_fill(~mask, 0), mask.view(len(tables), 1, length)


def decode_length_step(dtype: torch.dtype, device: torch.device) -> int:
    """The decodes' common context length is rounded up to a multiple of this; pure.

    On a CPU, bfloat16/float16 products go through oneDNN, which builds (JIT-compiles) a kernel for
    every new shape (epd.models.shape_buckets). With the longest context as the length, the decode
    attention's two products (scores, then values) changed shape at every step, and each step built
    both anew (0.2 ms each in oneDNN's log; batch-16 steps of the small checkpoints, six paired runs
    in one process: Kimi 1.1-5.1 ms faster in every run, 21.2 -> 19.3 ms median; Qwen 1.5 ms faster
    in the median pair). Rounded up to 16, they change every 16 steps, for at most 15 masked
    positions more per sequence. float32 runs through MKL, which builds nothing per shape, so there
    the padding only adds work (Kimi: 0.6-1.6 ms slower in 5 of 6 pairs): 1.
    """
    return 16 if pads_rows(dtype, device) else 1


class ModelRunner:
    def __init__(self, language: LanguageModel, cache: PagedKVCache, decode_in_place: bool = False) -> None:
        self.language = language
        self.model = language.model
        self.cache = cache
        self.block_size = cache.block_size
        self.decode_in_place = decode_in_place  # decodes read the pool with the native kernel (no gather)
        self.decode_length_step = decode_length_step(cache.keys[0].dtype, cache.device)
        self.direct: DirectDecode | None = None  # decode-only steps' forward, where the engine built one
        self.sampled_only_layer: int | None = None  # prompt steps compute only kept rows here (last_layer)

    @torch.inference_mode()
    def execute(self, scheduled: list[Scheduled]) -> dict[int, int]:
        """Run one step; returns the sampled token of every sequence that reached its last token, by id(seq)."""
        items = sorted(scheduled, key=lambda s: s.num_new_tokens != 1)  # decodes first (stable)
        batch = _Batch([], [], [], [], [], [], [])
        for item in items:
            self._pack(item, batch)
        device = self.cache.device  # the step is packed on the CPU, then moved once (no-ops on a CPU worker)
        layout = self._layout(items, batch).to(device)
        positions = packed_positions(batch.decode_columns, batch.positions).to(device)  # [T] or [rows, T]
        position_ids = positions.unsqueeze(0) if positions.ndim == 1 else positions.unsqueeze(1)
        images = [{name: t.to(device) for name, t in image.items()} for image in batch.images]
        mm = {"image": self.language.adapter.join_output(images)} if images else None
        input_ids = torch.tensor([batch.ids], dtype=torch.long, device=device)
        keep = torch.tensor(batch.keep, dtype=torch.long, device=device)
        with onednn_linear.decode_step(not layout.prefills):  # decode-only: products past 16 rows stay with MKL
            if self._direct(layout, batch):
                logits = self.direct(input_ids, position_ids, self.cache, layout, keep)
            else:
                with last_layer.kept_rows(keep if layout.sampled_only_layer is not None else None):
                    logits = self.model(input_ids=input_ids, position_ids=position_ids, cache=self.cache,
                                        use_cache=True, mm_encoder_outputs=mm, logits_to_keep=keep,
                                        epd_layout=layout).logits
        return sample_rows(logits[0].float(), batch.samplers)  # logits [n_keep, V], sampled in float32

    def _direct(self, layout: StepLayout, batch: _Batch) -> bool:
        """Whether this step runs through the direct decode forward: decodes only, read in place."""
        return (self.direct is not None and not layout.prefills and not batch.images and layout.pool is not None
                and self.direct.takes(batch.ids))

    def export_prompt(self, seq: Sequence) -> NamedTensors:
        """The blocks holding the prompt's KV (the last one may be partly filled)."""
        blocks = seq.block_table[:-(-seq.num_prompt_tokens // self.block_size)]
        return self.cache.export_blocks(blocks)

    def import_prompt(self, seq: Sequence, tensors: NamedTensors) -> None:
        """Write an exported prompt's KV into the blocks `seq` was given."""
        self.cache.import_tokens(tensors, seq.num_prompt_tokens, self._slots(seq, 0, seq.num_prompt_tokens))

    # --- packing --------------------------------------------------------------------------------

    def _pack(self, item: Scheduled, batch: _Batch) -> None:
        seq, start, stop = item.seq, item.start, item.start + item.num_new_tokens
        inputs: SequenceInputs = seq.inputs
        batch.ids.extend(seq.token_ids[start:stop])
        if item.num_new_tokens == 1:  # a decode (execute packs them first)
            batch.decode_tables.append(seq.block_table)
            batch.decode_lengths.append(stop)
            batch.decode_columns.append(inputs.plan.column(start))
        else:
            batch.positions.append(inputs.positions(start, stop))
            batch.slots.append(self._slots(seq, start, stop))
            batch.contexts.append(self._slots(seq, 0, stop))
        for span, tensors in zip(seq.images, inputs.images, strict=True):
            lo, hi = max(start, span.start), min(stop, span.start + span.num_tokens)
            if lo < hi:  # rows of this image that fall in the chunk, in order
                batch.images.append({k: v[lo - span.start:hi - span.start] for k, v in tensors.items()})
        if item.samples:
            batch.keep.append(len(batch.ids) - 1)
            batch.samplers.append((seq, inputs.sampler))

    def _slots(self, seq: Sequence, start: int, stop: int) -> torch.Tensor:
        """Pool slots of tokens [start, stop) of `seq`: [stop - start] long."""
        first, last = start // self.block_size, -(-stop // self.block_size)
        blocks = torch.tensor(seq.block_table[first:last], dtype=torch.long)
        slots = (blocks[:, None] * self.block_size + torch.arange(self.block_size)).reshape(-1)
        offset = start - first * self.block_size
        return slots[offset:offset + stop - start]

    def _layout(self, items: list[Scheduled], batch: _Batch) -> StepLayout:
        n = len(batch.decode_lengths)
        # Padding (slot 0: the zero block) is masked out, so the step only shapes the products.
        length = round_up(max(batch.decode_lengths, default=0), self.decode_length_step)
        slots: list[torch.Tensor] = []
        kv: list[torch.Tensor] = []
        contexts = mask = lengths = None
        if n:
            contexts, mask = decode_contexts(batch.decode_tables, batch.decode_lengths, self.block_size, length)
            lengths = torch.tensor(batch.decode_lengths)  # [n]
            slots.append(contexts[torch.arange(n), lengths - 1])  # where the new tokens are written
            if not self.decode_in_place:
                kv.append(contexts.reshape(-1))  # mask: [n, 1(G), L]
        in_place = self.decode_in_place and n > 0
        segments = []
        q_start, kv_start = n, 0 if in_place else n * length
        for item, context in zip(items[n:], batch.contexts, strict=True):
            q_len, kv_len = item.num_new_tokens, len(context)
            chunk_mask = None if q_len == kv_len else causal_chunk_mask(q_len, kv_len)
            segments.append(PrefillSegment(q_start, q_len, kv_start, kv_len, chunk_mask, item.samples))
            kv.append(context)
            q_start, kv_start = q_start + q_len, kv_start + kv_len
        return StepLayout(slot_mapping=torch.cat(slots + batch.slots),
                          kv_index=torch.cat(kv) if kv else torch.empty(0, dtype=torch.long), num_decodes=n,
                          decode_kv_len=length, decode_mask=mask, prefills=tuple(segments), decode_slots=contexts,
                          decode_lengths=lengths, pool=self.cache if in_place else None,
                          sampled_only_layer=self.sampled_only_layer if segments else None)


def sample_rows(logits: torch.Tensor, samplers: list[tuple[Sequence, Sampler]]) -> dict[int, int]:
    """logits [n, V], one row per sampler -> {id(seq): token}; greedy rows share one argmax."""
    tokens: dict[int, int] = {}
    greedy = [row for row, (_, sampler) in enumerate(samplers) if sampler.params.greedy]
    if greedy:
        picks = logits[greedy].argmax(dim=-1).tolist()
        for row, token in zip(greedy, picks, strict=True):
            tokens[id(samplers[row][0])] = token
    for row, (seq, sampler) in enumerate(samplers):
        if not sampler.params.greedy:
            tokens[id(seq)] = sampler(logits[row])
    return tokens
