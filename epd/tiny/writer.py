"""`epd make-tiny-model`: write a complete, randomly drawn checkpoint directory of one family and size."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from epd.tiny.families import FAMILIES, SIZES
from epd.tiny.tokenizer import build_tokenizer
from epd.tiny.weights import redraw_weights

# Bump when the generated weights or files change, so cached demo checkpoints are regenerated.
FORMAT_VERSION = 1


def make_tiny_model(family: str, size: str, out: str | Path, seed: int = 0) -> Path:
    """Write config, safetensors, tokenizer, processor configs and chat template into `out`."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose one of {sorted(FAMILIES)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {list(SIZES)}")
    spec = FAMILIES[family]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = build_tokenizer(
        spec.vocab_size[size], spec.special_tokens, seed, eos_token=spec.eos_token,
        pad_token=spec.pad_token, bos_token=spec.bos_token, chat_template=spec.chat_template,
    )
    config = spec.make_config(size, tokenizer)
    processor = spec.make_processor(size, tokenizer)

    from transformers import AutoModelForImageTextToText, GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    redraw_weights(model, seed)
    model.generation_config = GenerationConfig(
        eos_token_id=config.text_config.eos_token_id, pad_token_id=config.text_config.pad_token_id,
        bos_token_id=config.text_config.bos_token_id, do_sample=False,
    )
    model.save_pretrained(out)
    processor.save_pretrained(out)
    _write_provenance(out, family, size, seed, model)
    return out


def _write_provenance(out: Path, family: str, size: str, seed: int, model: torch.nn.Module) -> None:
    """A small record of how the directory was made, so a cached demo checkpoint can be checked."""
    info = {"family": family, "size": size, "seed": seed, "format": FORMAT_VERSION,
            "parameters": sum(p.numel() for p in model.parameters()), "generator": "epd make-tiny-model"}
    (out / "epd_tiny_model.json").write_text(json.dumps(info, indent=2) + "\n")
