"""Language side, in process: prefill the prompt (with vision embeddings), then decode with a KV cache.

Positions are computed by the family adapter and passed explicitly, so the language model never
needs pixels or the image processor: only token ids, encoder tensors and image grids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from epd.engine.encode import EncodedImage
from epd.engine.placeholders import expand_placeholders
from epd.engine.positions import PositionPlan
from epd.models.loading import LanguageModel


@dataclass
class SequenceState:
    """One request's running state between forward passes."""

    length: int  # tokens in the cache: prompt + generated so far
    cache: DynamicCache
    plan: PositionPlan


class LanguageRunner:
    """Prefill and single-token decode steps for one sequence at a time."""

    def __init__(self, language: LanguageModel) -> None:
        self.language = language
        self.image_token_id = int(language.config.image_token_id)

    def expand(self, token_ids: list[int], images: list[EncodedImage]) -> tuple[list[int], list[int]]:
        return expand_placeholders(token_ids, self.image_token_id, [im.num_tokens for im in images])

    @torch.inference_mode()
    def prefill(self, token_ids: list[int], images: list[EncodedImage], image_starts: list[int]
                ) -> tuple[torch.Tensor, SequenceState]:
        """token_ids already expanded, image_starts from `expand`; returns (next-token logits [V], state)."""
        if len(image_starts) != len(images):
            raise ValueError(f"{len(image_starts)} image start indices given for {len(images)} images")
        spans = [(s, im.grid_thw) for s, im in zip(image_starts, images, strict=True)]
        plan = self.language.adapter.plan_positions(self.language.config, token_ids, spans)
        cache = DynamicCache(config=self.language.config)
        mm = {"image": self.language.adapter.join_output([im.tensors for im in images])} if images else None
        logits = self._forward(token_ids, plan.prefill, cache, mm)
        return logits, SequenceState(len(token_ids), cache, plan)

    @torch.inference_mode()
    def decode_step(self, state: SequenceState, token: int) -> torch.Tensor:
        """Append `token` and return the logits [V] for the one after it."""
        index = state.length
        state.length += 1
        return self._forward([token], state.plan.decode_positions(index), state.cache, None,
                             total_len=index + 1)

    def resume(self, cache: DynamicCache, length: int, position_delta: int) -> SequenceState:
        """State for a sequence whose prompt was prefilled elsewhere (a decode worker's imported KV)."""
        # The family's plan for an empty prompt has the right number of position rows (1 or 3).
        empty = self.language.adapter.plan_positions(self.language.config, [], [])
        return SequenceState(length, cache, PositionPlan(prefill=empty.prefill, delta=position_delta))

    def _forward(self, ids: list[int], positions: torch.Tensor, cache: DynamicCache, mm,
                 total_len: int | None = None) -> torch.Tensor:
        input_ids = torch.tensor([ids], dtype=torch.long)  # [1, T]
        attention_mask = torch.ones(1, total_len or len(ids), dtype=torch.long)  # [1, past + T]
        # [T] -> [1, T]; [3, T] -> [3, 1, T] (M-RoPE rows first, as transformers expects)
        position_ids = positions.unsqueeze(0) if positions.ndim == 1 else positions.unsqueeze(1)
        out = self.language.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
            use_cache=True, mm_encoder_outputs=mm, logits_to_keep=1,
        )
        return out.logits[0, -1]  # [V]
