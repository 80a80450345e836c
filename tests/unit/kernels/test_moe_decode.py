"""The native decode-sized MoE experts (epd/kernels/moe_decode.cpp) against transformers' grouped path on
random layers: equal within bfloat16 rounding in bfloat16, within float32 rounding in float32; its
routing in epd.models.experts; its refusals. Model-free."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.moe import grouped_mm_experts_forward
from transformers.models.qwen3_vl_moe.configuration_qwen3_vl_moe import Qwen3VLMoeTextConfig
from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextExperts

from epd.kernels.native import load_kernels
from epd.models import experts


@pytest.fixture(scope="module", autouse=True)
def kernels():
    built = load_kernels()
    assert built.ok, built.detail


def _layer(hidden: int = 64, intermediate: int = 32, num_experts: int = 8) -> Qwen3VLMoeTextExperts:
    config = Qwen3VLMoeTextConfig(hidden_size=hidden, moe_intermediate_size=intermediate, num_experts=num_experts,
                                  num_experts_per_tok=4)
    layer = Qwen3VLMoeTextExperts(config)
    with torch.no_grad():
        layer.gate_up_proj.normal_(0, 0.2, generator=torch.Generator().manual_seed(1))
        layer.down_proj.normal_(0, 0.2, generator=torch.Generator().manual_seed(2))
    return layer.to(torch.bfloat16)


def _routing(tokens: int, num_experts: int, weight_dtype: torch.dtype, seed: int, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, 64, generator=gen).to(dtype)  # [T, H]
    index = torch.stack([torch.randperm(num_experts, generator=gen)[:4] for _ in range(tokens)])  # [T, 4]
    weights = torch.softmax(torch.randn(tokens, 4, generator=gen), dim=-1).to(weight_dtype)  # [T, 4]
    return hidden, index, weights


@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32], ids=["Qwen's router", "Kimi's router"])
@pytest.mark.parametrize("tokens", [1, 3, 7, 16])  # 7 and 16: an expert with more rows than one pass takes (4)
def test_equals_the_library_within_bfloat16_rounding(tokens, weight_dtype):
    layer = _layer()
    hidden, index, weights = _routing(tokens, layer.num_experts, weight_dtype, seed=tokens)
    with torch.inference_mode():
        got = torch.ops.epd.moe_decode(hidden, index, weights, layer.gate_up_proj, layer.down_proj)
        want = grouped_mm_experts_forward(layer, hidden, index, weights)
    assert got.dtype == torch.bfloat16 and got.shape == (tokens, 64)
    # Dot products summed in another order than oneDNN's: a rounding step here and there, carried
    # through the gate and the down projection.
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert (got == want).float().mean() > 0.8


@pytest.mark.parametrize("tokens", [1, 7, 16])
def test_equals_the_library_within_float32_rounding(tokens):
    layer = _layer().float()
    hidden, index, weights = _routing(tokens, layer.num_experts, torch.float32, seed=tokens, dtype=torch.float32)
    with torch.inference_mode():
        got = torch.ops.epd.moe_decode(hidden, index, weights, layer.gate_up_proj, layer.down_proj)
        want = grouped_mm_experts_forward(layer, hidden, index, weights)
    assert got.dtype == torch.float32 and got.shape == (tokens, 64)
    # No rounding to bfloat16 anywhere (an error of a bfloat16 step, 4e-3, would fail this); the sums
    # run in another order than MKL's, so not the same bits.
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_decode_steps_take_it_and_prompts_do_not(one_thread):
    layer = _layer()
    hidden, index, weights = _routing(4, layer.num_experts, torch.bfloat16, seed=0)
    assert experts._decodes_natively(layer, hidden, index)  # 16 pairs for 8 experts, in bfloat16
    most_tokens = int(experts.NATIVE_DECODE_PAIRS_PER_EXPERT * layer.num_experts) // 4  # top-4
    assert experts._decodes_natively(layer, *_routing(most_tokens, layer.num_experts, torch.bfloat16, seed=1)[:2])
    prompt = _routing(most_tokens + 1, layer.num_experts, torch.bfloat16, seed=1)
    assert not experts._decodes_natively(layer, prompt[0], prompt[1])  # a prompt: the batched products
    float_layer = _layer().float()
    assert experts._decodes_natively(float_layer, hidden.float(), index)  # float32 too
    assert not experts._decodes_natively(float_layer, hidden, index)  # bfloat16 rows, float32 weights
    most_float32 = int(experts.NATIVE_DECODE_PAIRS_PER_EXPERT_FLOAT32 * layer.num_experts) // 4
    for tokens, taken in ((most_float32, True), (most_float32 + 1, False)):
        rows, experts_of = _routing(tokens, layer.num_experts, torch.float32, seed=2, dtype=torch.float32)[:2]
        assert experts._decodes_natively(float_layer, rows, experts_of) is taken
    with torch.inference_mode():
        got = experts.native_experts_forward(layer, hidden, index, weights)
        assert torch.equal(got, torch.ops.epd.moe_decode(hidden, index, weights, layer.gate_up_proj, layer.down_proj))


def test_refusals_say_what_is_wrong():
    layer = _layer()
    hidden, index, weights = _routing(2, layer.num_experts, torch.bfloat16, seed=3)
    up, down = layer.gate_up_proj, layer.down_proj
    with pytest.raises(RuntimeError, match=r"index\[1, 2\] = 8 is not one of the 8 experts"):
        bad = index.clone()
        bad[1, 2] = 8
        torch.ops.epd.moe_decode(hidden, bad, weights, up, down)
    with pytest.raises(RuntimeError, match="hidden must be"):
        torch.ops.epd.moe_decode(hidden.half(), index, weights, up, down)
    with pytest.raises(RuntimeError, match="in hidden's dtype, Float"):
        torch.ops.epd.moe_decode(hidden.float(), index, weights.float(), up, down)
    with pytest.raises(RuntimeError, match="do not fit hidden rows of 48"):
        torch.ops.epd.moe_decode(hidden[:, :48].contiguous(), index, weights, up, down)
    with pytest.raises(RuntimeError, match="weights must be float32"):
        torch.ops.epd.moe_decode(hidden, index, weights.half(), up, down)
    with pytest.raises(RuntimeError, match="weights must be float32"):  # float32 rows: float32 weights
        torch.ops.epd.moe_decode(hidden.float(), index, weights, up.float(), down.float())


def test_several_threads_take_fewer_pairs():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert experts._pairs_per_expert(torch.bfloat16) == experts.NATIVE_DECODE_PAIRS_PER_EXPERT
        torch.set_num_threads(2)
        assert experts._pairs_per_expert(torch.bfloat16) == experts.NATIVE_DECODE_PAIRS_PER_EXPERT_THREADED
        # float32: MKL's calls cost more than oneDNN's bfloat16 ones; the kernel wins further out on any count
        assert experts._pairs_per_expert(torch.float32) == experts.NATIVE_DECODE_PAIRS_PER_EXPERT_FLOAT32
    finally:
        torch.set_num_threads(threads)
