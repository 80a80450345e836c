"""The latent attention's interleaved rotary embedding in one native call (epd/kernels/rope_interleave.cpp)
against transformers' `apply_rotary_pos_emb_interleave`, bit for bit; its refusals; its installation
by epd.engine.mla. Model-free."""

from __future__ import annotations

import pytest
import torch
from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
    apply_rotary_pos_emb_interleave,
)

from epd.engine import mla
from epd.kernels.native import load_kernels


@pytest.fixture(scope="module", autouse=True)
def kernels():
    built = load_kernels()
    assert built.ok, built.detail


def _inputs(heads: int, tokens: int, rope: int, nope: int = 16, seed: int = 0):
    """q_rot and k_rot as paged_mla_forward has them (views of wider projections) and the model's cos, sin."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(1, tokens, heads, nope + rope, generator=generator).transpose(1, 2)  # [1, H, T, Dn + Dr]
    q_rot = q[..., nope:]  # not contiguous
    k_rot = torch.randn(1, tokens, 128 + rope, generator=generator)[..., 128:].view(1, 1, tokens, rope)
    config = DeepseekV3Config(hidden_size=64, num_attention_heads=heads, qk_rope_head_dim=rope, rope_interleave=True)
    positions = torch.arange(100, 100 + tokens)[None]
    cos, sin = DeepseekV3RotaryEmbedding(config)(q_rot, positions)  # [1, T, Dr] each
    return q_rot, k_rot, cos, sin


@pytest.mark.parametrize(("heads", "tokens", "rope"), [(8, 1, 32), (8, 5, 32), (4, 300, 64), (1, 2, 2)])
def test_equals_the_library_bit_for_bit(heads, tokens, rope):
    q, k, cos, sin = _inputs(heads, tokens, rope)
    got_q, got_k = torch.ops.epd.rope_interleave(q, k, cos, sin)
    want_q, want_k = apply_rotary_pos_emb_interleave(q, k, cos, sin)
    assert got_q.shape == want_q.shape and got_k.shape == want_k.shape and got_q.is_contiguous()
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)


def test_refuses_what_it_does_not_compute():
    q, k, cos, sin = _inputs(2, 3, 8)
    with pytest.raises(RuntimeError, match="float32 CPU"):
        torch.ops.epd.rope_interleave(q.bfloat16(), k, cos, sin)
    with pytest.raises(RuntimeError, match="does not match cos"):
        torch.ops.epd.rope_interleave(q[:, :, :2], k, cos, sin)
    with pytest.raises(RuntimeError, match="cos and sin"):
        torch.ops.epd.rope_interleave(q, k, cos, sin[:, :2])


@pytest.mark.parametrize("native", [True, False])
def test_installed_where_the_layer_interleaves_and_the_kernels_are_built(native):
    layers = torch.nn.ModuleList([DeepseekV3Attention(DeepseekV3Config(hidden_size=64, rope_interleave=flag), 0)
                                  for flag in (True, False)])
    assert mla.install(layers, native) == 2
    assert [getattr(m, mla.NATIVE_ROPE) for m in layers] == [native, False]
    q, k, cos, sin = _inputs(2, 3, 8)
    for inputs in ((q, k, cos, sin), (q.double(), k.double(), cos.double(), sin.double())):
        for layer in layers:  # each path gives the layer's own function's bits (float64: the library's path)
            got, want = mla.rotary(layer, *inputs), mla._rope(layer)(*inputs)
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
