"""Our experts forward against transformers' grouped path (small experts layers, random weights): bit for
bit in float32; in bfloat16 on a CPU through padded batched products, equal within bfloat16 rounding,
and only where padding is cheap."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.moe import grouped_mm_experts_forward
from transformers.models.qwen3_vl_moe.configuration_qwen3_vl_moe import Qwen3VLMoeTextConfig
from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextExperts

from epd.models import experts
from epd.models.experts import grouped_experts_forward


def _layer(dtype: torch.dtype, hidden: int = 32, intermediate: int = 16, num_experts: int = 8
           ) -> Qwen3VLMoeTextExperts:
    config = Qwen3VLMoeTextConfig(hidden_size=hidden, moe_intermediate_size=intermediate, num_experts=num_experts,
                                  num_experts_per_tok=2)
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


def _both(layer, tokens: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(ours, the library's) on `tokens` random rows, hidden size taken from the layer."""
    width = layer.gate_up_proj.shape[-1]
    hidden = torch.randn(tokens, width, generator=torch.Generator().manual_seed(tokens)).to(dtype)
    index, weights = _routing(tokens, layer, seed=tokens)
    with torch.inference_mode():
        return (grouped_experts_forward(layer, hidden, index, weights.to(dtype)),
                grouped_mm_experts_forward(layer, hidden, index, weights.to(dtype)))


@pytest.fixture
def grouped_calls(monkeypatch) -> list[int]:
    """Counts the calls of the grouped products (the path padding would replace)."""
    calls = []
    real = experts._grouped_products
    monkeypatch.setattr(experts, "_grouped_products", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.parametrize("tokens", [1, 3, 40])  # a decode, a few decodes (idle experts), a prompt
def test_float32_equals_the_library_grouped_path_bit_for_bit(tokens, grouped_calls):
    ours, theirs = _both(_layer(torch.float32), tokens, torch.float32)
    assert ours.dtype == torch.float32 and ours.shape == (tokens, 32)
    assert torch.equal(ours, theirs)
    assert grouped_calls == [1]  # float32 never pads


@pytest.mark.parametrize("tokens", [1, 3, 40, 100])  # 100: a prompt whose busiest expert's rows (> 16) are bucketed
def test_bfloat16_pads_small_experts_and_stays_within_rounding_of_the_library(tokens, grouped_calls):
    ours, theirs = _both(_layer(torch.bfloat16), tokens, torch.bfloat16)
    assert ours.dtype == torch.bfloat16 and ours.shape == (tokens, 32)
    assert grouped_calls == []  # padded: experts of 3 KiB cost less to read than a call
    # The same rows meet the same weights; at most the rounding of the last bfloat16 bit may differ.
    ulp = theirs.float().abs().clamp_min(1e-3) * 2.0 ** -7
    assert ((ours.float() - theirs.float()).abs() <= ulp).all()


def test_large_idle_experts_keep_the_grouped_products(grouped_calls):
    # One token, two of eight experts busy: reading six idle 1.5 MiB experts costs more than two calls.
    ours, theirs = _both(_layer(torch.bfloat16, hidden=512, intermediate=512), 1, torch.bfloat16)
    assert grouped_calls == [1]
    assert torch.equal(ours, theirs)


def test_padding_that_would_more_than_quadruple_the_rows_keeps_the_grouped_products(grouped_calls):
    layer = _layer(torch.bfloat16, num_experts=16)
    hidden = torch.randn(16, 32).to(torch.bfloat16)
    index = torch.tensor([[2 * (t % 8), 2 * (t % 8) + 1] for t in range(8)] + [[0, 1]] * 8)  # all busy, 0 and 1 most
    weights = torch.full((16, 2), 0.5, dtype=torch.bfloat16)
    with torch.inference_mode():
        ours = grouped_experts_forward(layer, hidden, index, weights)
        theirs = grouped_mm_experts_forward(layer, hidden, index, weights)
    assert grouped_calls == [1]  # 16 experts x 9 rows padded against 32 real ones
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


@pytest.mark.parametrize("tokens", [1, 3])  # some experts idle: the grouped products
def test_float32_router_weights_on_bfloat16_rows_combine_as_the_library_does(tokens, grouped_calls):
    # DeepSeek-V3's router (Kimi) hands float32 weights to bfloat16 experts: the library multiplies and
    # sums in float32 and rounds once; ours must too (it converts before multiplying, not after).
    layer = _layer(torch.bfloat16, hidden=512, intermediate=512)
    hidden = torch.randn(tokens, 512, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    index, weights = _routing(tokens, layer, seed=5)
    assert weights.dtype == torch.float32
    with torch.inference_mode():
        ours = grouped_experts_forward(layer, hidden, index, weights)
        theirs = grouped_mm_experts_forward(layer, hidden, index, weights)
    assert grouped_calls == [1]
    assert ours.dtype == torch.bfloat16 and torch.equal(ours, theirs)


@pytest.mark.parametrize("dtype, tokens, hidden", [(torch.float32, 40, 32), (torch.bfloat16, 100, 32),
                                                   (torch.bfloat16, 3, 512)],
                         ids=["float32 grouped", "bfloat16 padded", "bfloat16 grouped (large idle experts)"])
def test_the_native_combine_gives_the_same_bits(dtype, tokens, hidden, monkeypatch):
    from epd.kernels.native import load_kernels
    from epd.models.experts import native_experts_forward

    assert load_kernels().ok
    # The combine's path, not moe_decode's (which would take the 3-token case and promises no bits).
    monkeypatch.setattr(experts, "_decodes_natively", lambda *args: False)
    layer = _layer(dtype, hidden=hidden, intermediate=hidden // 2 if hidden > 32 else 16)
    rows = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(3)).to(dtype)
    index, weights = _routing(tokens, layer, seed=3)
    for routing in (weights.to(dtype), weights):  # the router's dtype (Qwen), float32 (Kimi's router)
        with torch.inference_mode():
            assert torch.equal(native_experts_forward(layer, rows, index, routing),
                               grouped_experts_forward(layer, rows, index, routing))
