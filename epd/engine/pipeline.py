"""Encode -> prefill -> decode in one process: the reference path that the services split apart.

The same engine as the workers, one request at a time (`generate_ids`) or many at once
(`generate_many`, batched by the engine's scheduler).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from transformers import AutoTokenizer, GenerationConfig

from epd.chat import render_prompt
from epd.digest import embedding_key, pixel_digest, processor_fingerprint
from epd.engine.encode import ImageEncoder
from epd.engine.engine import Engine, EngineConfig
from epd.engine.params import SamplingParams
from epd.engine.placeholders import expand_placeholders
from epd.engine.sequence import Sequence
from epd.models.loading import load_encoder, load_language_model


@dataclass(frozen=True)
class Generation:
    """Generated token ids and why generation ended ("stop": an EOS id, "length": max_tokens)."""

    token_ids: list[int]
    finish_reason: str


@dataclass(frozen=True)
class PipelineResult:
    token_ids: list[int]
    text: str
    prompt_tokens: int
    finish_reason: str


class InProcessPipeline:
    """Loads each role separately (as the services do) and runs requests through one engine."""

    def __init__(self, model_dir: str | Path, engine_config: EngineConfig | None = None,
                 dtype: torch.dtype | None = None) -> None:
        self.model_dir = Path(model_dir)
        engine_config = engine_config or EngineConfig(kv_cache_bytes=256 << 20)
        self.encoder = ImageEncoder(load_encoder(self.model_dir, dtype), engine_config.kernels)
        language = load_language_model(self.model_dir, dtype)
        self.image_token_id = int(language.config.image_token_id)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.eos_token_ids = eos_token_ids(self.model_dir, language.config)
        self.engine = Engine(language, engine_config,
                             self.eos_token_ids, role="in_process")
        self.fingerprint = processor_fingerprint(self.model_dir)  # image digests key the prefix cache
        self._ids = itertools.count()

    def sequence(self, prompt_ids: list[int], images: list[Image.Image], params: SamplingParams) -> Sequence:
        """Encode the images and build the engine sequence for a prompt with one placeholder per image."""
        encoded = self.encoder.encode(images)
        expanded, starts = expand_placeholders(prompt_ids, self.image_token_id, [e.num_tokens for e in encoded])
        digests = [embedding_key(pixel_digest(im.convert("RGB")), self.fingerprint) for im in images]
        return self.engine.new_sequence(f"local-{next(self._ids)}", expanded, params, encoded, starts, digests)

    def generate_many(self, requests: list[tuple[list[int], list[Image.Image], SamplingParams]]
                      ) -> list[tuple[Generation, int]]:
        """Run several requests through the engine together; (generation, expanded prompt length) each."""
        seqs = [self.sequence(*request) for request in requests]
        self.engine.run_to_completion(seqs)
        return [(Generation(s.token_ids[s.num_prompt_tokens:], s.finish.value), s.num_prompt_tokens) for s in seqs]

    def generate_ids(self, prompt_ids: list[int], images: list[Image.Image], params: SamplingParams
                     ) -> tuple[Generation, int]:
        """prompt_ids hold one placeholder per image; returns (generation, expanded prompt length)."""
        [result] = self.generate_many([(prompt_ids, images, params)])
        return result

    def chat(self, messages: list[dict], images: list[Image.Image], params: SamplingParams) -> PipelineResult:
        prompt_ids = render_prompt(self.tokenizer, messages)
        gen, prompt_tokens = self.generate_ids(prompt_ids, images, params)
        text = self.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        return PipelineResult(gen.token_ids, text, prompt_tokens, gen.finish_reason)


def eos_token_ids(model_dir: Path, config) -> list[int]:
    """EOS ids from generation_config.json, else from the text config."""
    try:
        eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except OSError:
        eos = None
    if eos is None:
        eos = config.get_text_config().eos_token_id
    if eos is None:
        return []
    return [eos] if isinstance(eos, int) else list(eos)
