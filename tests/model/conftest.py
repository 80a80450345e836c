"""Generated checkpoints shared by the model tests, and the transformers reference to compare against."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from epd.tiny.writer import make_tiny_model

FAMILIES = ("kimi_k25", "qwen3_vl_moe")


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tiny")
    return {fam: str(make_tiny_model(fam, "tiny", root / fam, seed=7)) for fam in FAMILIES}


def sample_images() -> list[Image.Image]:
    """Two images of different sizes and aspect ratios, with structure (not flat colour)."""
    gradient = Image.radial_gradient("L").convert("RGB").resize((120, 90))
    checker = Image.new("RGB", (64, 100), (200, 40, 40))
    for x in range(0, 64, 16):
        for y in range(0, 100, 20):
            checker.paste((20, 40, 220), (x, y, x + 8, y + 10))
    return [gradient, checker]


def user_message(num_images: int, text: str, *, with_pixels: list[Image.Image] | None = None) -> dict:
    """A user turn with image parts first; `with_pixels` fills them for the transformers processor."""
    parts = [{"type": "image", **({"image": with_pixels[i]} if with_pixels else {})} for i in range(num_images)]
    return {"role": "user", "content": parts + [{"type": "text", "text": text}]}


@torch.inference_mode()
def reference_generate(model_dir: str, messages: list[dict], max_new_tokens: int) -> tuple[list[int], int]:
    """Greedy tokens from plain transformers: processor chat template + generate(do_sample=False)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir).eval()
    inputs = processor.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=True, return_tensors="pt"
    )
    out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    prompt_len = inputs["input_ids"].shape[1]
    return out[0, prompt_len:].tolist(), prompt_len
