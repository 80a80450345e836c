"""Our experts forward equals transformers' grouped path bit for bit (a small experts layer, random weights)."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.moe import grouped_mm_experts_forward
from transformers.models.qwen3_vl_moe.configuration_qwen3_vl_moe import Qwen3VLMoeTextConfig
from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextExperts

from epd.models.experts import grouped_experts_forward


def _layer(dtype: torch.dtype) -> Qwen3VLMoeTextExperts:
    config = Qwen3VLMoeTextConfig(hidden_size=32, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2)
    layer = Qwen3VLMoeTextExperts(config)
    with torch.no_grad():
        layer.gate_up_proj.normal_(0, 0.2)
        layer.down_proj.normal_(0, 0.2)
    return layer.to(dtype)


def _routing(tokens: int, layer, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, 2] distinct experts per token, and their softmaxed weights."""
    generator = torch.Generator().manual_seed(seed)
    index = torch.stack([torch.randperm(layer.num_experts, generator=generator)[:2] for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, 2, generator=generator), dim=-1)
    return index, weights


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 3, 40])  # a decode, a few decodes (idle experts), a prompt
def test_equals_the_library_grouped_path_bit_for_bit(dtype, tokens):
    layer = _layer(dtype)
    hidden = torch.randn(tokens, 32, generator=torch.Generator().manual_seed(tokens)).to(dtype)
    index, weights = _routing(tokens, layer, seed=tokens)
    with torch.inference_mode():
        ours = grouped_experts_forward(layer, hidden, index, weights.to(dtype))
        theirs = grouped_mm_experts_forward(layer, hidden, index, weights.to(dtype))
    assert ours.dtype == dtype and ours.shape == (tokens, 32)
    assert torch.equal(ours, theirs)


def test_layers_it_does_not_cover_run_the_library_forward():
    layer = _layer(torch.float32)
    layer.has_post_expert_norm = True  # a layout the shortcut does not handle
    layer.post_expert_norm = torch.nn.Identity()
    hidden = torch.randn(5, 32)
    index, weights = _routing(5, layer, seed=0)
    with torch.inference_mode():
        assert torch.equal(grouped_experts_forward(layer, hidden, index, weights),
                           grouped_mm_experts_forward(layer, hidden, index, weights))
