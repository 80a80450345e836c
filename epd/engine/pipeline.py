"""Encode -> prefill -> decode in one process: the reference path that the services split apart."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from PIL import Image
from transformers import AutoTokenizer, GenerationConfig

from epd.chat import render_prompt
from epd.engine.encode import ImageEncoder
from epd.engine.generate import Generation, decode_loop
from epd.engine.language import LanguageRunner
from epd.engine.sampling import SamplingParams
from epd.models.loading import load_encoder, load_language_model


@dataclass(frozen=True)
class PipelineResult:
    token_ids: list[int]
    text: str
    prompt_tokens: int
    finish_reason: str


class InProcessPipeline:
    """Loads each role separately (as the services do) and runs one request at a time."""

    def __init__(self, model_dir: str | Path) -> None:
        self.model_dir = Path(model_dir)
        self.encoder = ImageEncoder(load_encoder(self.model_dir))
        self.language = LanguageRunner(load_language_model(self.model_dir))
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.eos_token_ids = eos_token_ids(self.model_dir, self.language.language.config)

    def generate_ids(self, prompt_ids: list[int], images: list[Image.Image], params: SamplingParams
                     ) -> tuple[Generation, int]:
        """prompt_ids hold one placeholder per image; returns (generation, expanded prompt length)."""
        encoded = self.encoder.encode(images)
        expanded, image_starts = self.language.expand(prompt_ids, encoded)
        logits, state = self.language.prefill(expanded, encoded, image_starts)
        gen = decode_loop(logits, lambda tok: self.language.decode_step(state, tok), params, self.eos_token_ids)
        return gen, len(expanded)

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
