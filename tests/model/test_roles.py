"""Per-role loading: each role holds only its own weights, and together they are the full model."""

from __future__ import annotations

import shutil

import pytest
import torch

from epd.models.errors import MissingImageProcessorError
from epd.models.loading import load_encoder, load_language_model
from tests.model.conftest import FAMILIES

VISION_PREFIXES = ("model.vision_tower.", "model.mm_projector.", "model.visual.")
LANGUAGE_PREFIXES = ("model.language_model.", "lm_head.")


@pytest.mark.parametrize("family", FAMILIES)
def test_roles_are_disjoint_and_complete(family, tiny_dirs):
    from transformers import AutoModelForImageTextToText

    full = dict(AutoModelForImageTextToText.from_pretrained(tiny_dirs[family]).named_parameters())
    encoder = dict(load_encoder(tiny_dirs[family]).model.named_parameters())
    language = dict(load_language_model(tiny_dirs[family]).model.named_parameters())

    assert encoder and language
    assert set(encoder).isdisjoint(language)
    assert set(encoder) | set(language) == set(full)
    assert all(name.startswith(VISION_PREFIXES) for name in encoder), sorted(encoder)
    assert all(name.startswith(LANGUAGE_PREFIXES) for name in language), sorted(language)
    for name, param in {**encoder, **language}.items():
        assert torch.equal(param, full[name]), f"{name} differs from the full model's"


@pytest.mark.parametrize("family", FAMILIES)
def test_encoder_without_processor_config_fails_at_load(family, tiny_dirs, tmp_path):
    broken = tmp_path / "no_processor"
    shutil.copytree(tiny_dirs[family], broken)
    (broken / "processor_config.json").unlink()
    with pytest.raises(MissingImageProcessorError) as info:
        load_encoder(broken)
    assert str(broken) in str(info.value) and "preprocessor_config.json" in str(info.value)
    # The language side needs no processor and still loads.
    assert load_language_model(broken).model is not None


@pytest.mark.parametrize("family", FAMILIES)
def test_the_language_role_runs_its_experts_through_our_grouped_forward(family, tiny_dirs):
    from epd.models.experts import NAME

    model = load_language_model(tiny_dirs[family]).model
    experts = [m for m in model.modules() if hasattr(m, "gate_up_proj") and hasattr(m, "config")]
    assert experts, "the tiny checkpoint has MoE layers"
    assert {m.config._experts_implementation for m in experts} == {NAME}
