"""Family adapters, keyed by `config.model_type`: what differs between multimodal MoE families.

An adapter says which submodules belong to which role, how the language side numbers positions,
and how the encoder's `get_image_features` output is flattened into named tensors (for the wire)
and rebuilt into the `mm_encoder_outputs` the language model consumes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from epd.engine.positions import PositionPlan, mrope_plan, text_plan

# name -> tensor; one image's encoder output, e.g. {"pooler_output": [N, H], "deepstack.0": [N, H]}
ImageTensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class FamilyAdapter:
    """One model family's split into an encoder role and a language role."""

    model_type: str
    model_class: str  # transformers class name of the full image-text-to-text model
    encoder_drops: tuple[str, ...]  # submodules the encoder role deletes before loading
    language_drops: tuple[str, ...]  # submodules the language role deletes before loading
    split_output: Callable[[object, int], list[ImageTensors]]
    join_output: Callable[[list[ImageTensors]], object]
    plan_positions: Callable[[PretrainedConfig, list[int], list[tuple[int, tuple[int, int, int]]]], PositionPlan]
    latent_attention: bool = False  # MLA layers: the engine runs them with the up-projection absorbed

    def model_cls(self) -> type:
        import transformers

        return getattr(transformers, self.model_class)


def _pooled_split(output, num_images: int) -> list[ImageTensors]:
    pooled = output.pooler_output  # tuple of [N_i, H], one per image
    assert len(pooled) == num_images, f"encoder returned {len(pooled)} outputs for {num_images} images"
    return [{"pooler_output": p} for p in pooled]


def _pooled_join(images: list[ImageTensors]):
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    return BaseModelOutputWithPooling(pooler_output=tuple(t["pooler_output"] for t in images))


def _deepstack_split(output, num_images: int) -> list[ImageTensors]:
    images = _pooled_split(output, num_images)
    for level, per_image in enumerate(output.deepstack_features):  # levels x images x [N_i, H]
        for tensors, feature in zip(images, per_image, strict=True):
            tensors[f"deepstack.{level}"] = feature
    return images


def _deepstack_join(images: list[ImageTensors]):
    from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import BaseModelOutputWithDeepstackFeatures

    levels = sorted(int(k.split(".")[1]) for k in images[0] if k.startswith("deepstack.")) if images else []
    return BaseModelOutputWithDeepstackFeatures(
        pooler_output=tuple(t["pooler_output"] for t in images),
        deepstack_features=[tuple(t[f"deepstack.{lv}"] for t in images) for lv in levels],
    )


def _kimi_positions(config, token_ids, images) -> PositionPlan:
    return text_plan(len(token_ids))


def _qwen_positions(config, token_ids, images) -> PositionPlan:
    return mrope_plan(len(token_ids), images, config.vision_config.spatial_merge_size)


ADAPTERS: dict[str, FamilyAdapter] = {
    "kimi_k25": FamilyAdapter(
        model_type="kimi_k25",
        model_class="Kimi_K25ForConditionalGeneration",
        encoder_drops=("model.language_model", "lm_head"),
        language_drops=("model.vision_tower", "model.mm_projector"),
        split_output=_pooled_split,
        join_output=_pooled_join,
        plan_positions=_kimi_positions,
        latent_attention=True,
    ),
    "qwen3_vl_moe": FamilyAdapter(
        model_type="qwen3_vl_moe",
        model_class="Qwen3VLMoeForConditionalGeneration",
        encoder_drops=("model.language_model", "lm_head"),
        language_drops=("model.visual",),
        split_output=_deepstack_split,
        join_output=_deepstack_join,
        plan_positions=_qwen_positions,
    ),
}


def adapter_for(model_type: str) -> FamilyAdapter:
    """The adapter of a family, or a ValueError naming the families that have one."""
    try:
        return ADAPTERS[model_type]
    except KeyError:
        raise ValueError(
            f"no family adapter for model_type {model_type!r}; supported: {sorted(ADAPTERS)}"
        ) from None
