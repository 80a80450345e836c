"""Per-role loading: the encoder role gets the image processor + vision tower + projector only, the
language role embeddings + decoder layers + lm_head only.

Each role is a subclass of the family's `...ForConditionalGeneration` whose `__init__` deletes the other
role's submodules before `from_pretrained` fills the rest, so transformers' own checkpoint
conversion (fused experts, renamed keys) still applies, and the other role's weights are reported
as unexpected keys and never materialised.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
from transformers import AutoConfig, AutoImageProcessor, PretrainedConfig
from transformers.utils import logging as hf_logging

from epd.models import experts, patch_embed, vision_rope
from epd.models.processor_files import require_checkpoint_dir, require_image_processor_config
from epd.models.registry import FamilyAdapter, adapter_for


@dataclass
class EncoderModel:
    """What an encoder owns: the image processor and the vision side of the model."""

    model_dir: Path
    config: PretrainedConfig
    adapter: FamilyAdapter
    image_processor: object  # a transformers image processor; never None
    model: torch.nn.Module


@dataclass
class LanguageModel:
    """What prefill and decode own: the language side of the model."""

    model_dir: Path
    config: PretrainedConfig
    adapter: FamilyAdapter
    model: torch.nn.Module


def load_config(model_dir: str | Path) -> tuple[PretrainedConfig, FamilyAdapter]:
    root = require_checkpoint_dir(model_dir)
    config = AutoConfig.from_pretrained(root)
    return config, adapter_for(config.model_type)


def load_encoder(model_dir: str | Path, dtype: torch.dtype | None = None, device=None) -> EncoderModel:
    """Image processor + vision tower + projector. Fails at once if the processor config is missing."""
    root = Path(model_dir)
    require_image_processor_config(root)
    config, adapter = load_config(root)
    image_processor = AutoImageProcessor.from_pretrained(root)
    model = _load_role(root, adapter, "encoder", dtype, device)
    patch_embed.install(model)
    vision_rope.install(model)
    return EncoderModel(root, config, adapter, image_processor, model)


def load_language_model(model_dir: str | Path, dtype: torch.dtype | None = None, device=None) -> LanguageModel:
    """Embeddings + decoder layers + lm_head, without the vision tower."""
    root = Path(model_dir)
    config, adapter = load_config(root)
    model = _load_role(root, adapter, "language", dtype, device)
    experts.install(model)
    return LanguageModel(root, config, adapter, model)


def _load_role(root: Path, adapter: FamilyAdapter, role: str, dtype: torch.dtype | None,
               device=None) -> torch.nn.Module:
    """The role's model in eval mode, with `dtype` weights, on `device` (None: the CPU)."""
    cls = role_class(adapter, role)
    hf_logging.disable_progress_bar()
    previous = hf_logging.get_verbosity()
    # The other role's keys are reported as UNEXPECTED on every load; that is the point, not news.
    hf_logging.set_verbosity_error()
    try:
        model = cls.from_pretrained(root, dtype=dtype or torch.float32)
    finally:
        hf_logging.set_verbosity(previous)
    if device is not None:
        model = model.to(device)
    return model.eval()


def drop_submodules(model: torch.nn.Module, paths: tuple[str, ...]) -> None:
    """Delete the submodules at `paths` (e.g. an adapter's `language_drops`) from `model`, in place."""
    for path in paths:
        parent, _, leaf = path.rpartition(".")
        delattr(model.get_submodule(parent), leaf)


@cache
def role_class(adapter: FamilyAdapter, role: str) -> type:
    """The family's model class, minus the other role's submodules."""
    base = adapter.model_cls()
    drops = {"encoder": adapter.encoder_drops, "language": adapter.language_drops}[role]

    def __init__(self, config):
        base.__init__(self, config)
        drop_submodules(self, drops)

    attrs = {"__init__": __init__, "__module__": __name__}
    if role == "encoder":
        # lm_head is gone, so there is nothing to tie it to.
        attrs["_tied_weights_keys"] = {}
        attrs["get_input_embeddings"] = lambda self: None
    return type(f"{base.__name__}_{role.capitalize()}Role", (base,), attrs)
