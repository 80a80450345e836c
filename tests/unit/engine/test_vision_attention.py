"""The vision tower's attention through oneDNN products (epd.engine.vision_attention) against the
library's SDPA function, and what it leaves to SDPA."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from epd.engine import onednn_linear
from epd.engine.vision_attention import vision_attention
from epd.kernels.native import load_kernels

pytestmark = pytest.mark.skipif(onednn_linear.unavailable() is not None, reason=str(onednn_linear.unavailable()))


@pytest.fixture(scope="module", autouse=True)
def kernels():  # the softmax is native (epd/kernels/softmax_rows.cpp); the encoder installs this only with them
    built = load_kernels()
    assert built.ok, built.detail


class _Module(torch.nn.Module):
    is_causal = False  # what the library's SDPA function reads off a vision attention module


def _qkv(patches: int, heads: int = 3, head_dim: int = 16, dtype=torch.float32):
    """[1, H, n, d] views laid out as a vision tower makes them: a transpose of [n, H, d]."""
    generator = torch.Generator().manual_seed(patches)
    return [torch.randn(patches, heads, head_dim, generator=generator).to(dtype).transpose(0, 1).unsqueeze(0)
            for _ in range(3)]


@pytest.mark.parametrize("patches", [1, 4, 100, 101])  # 101: keys padded to 102, the pad masked
@pytest.mark.parametrize("scaling", [None, 0.3])
def test_equals_the_librarys_sdpa_within_float32_rounding(patches, scaling, monkeypatch):
    from epd.engine import vision_attention as module

    def no_fallback(*args, **kwargs):
        raise AssertionError("a plain float32 call went to SDPA: the equality below would prove nothing")

    monkeypatch.setattr(module, "sdpa_attention_forward", no_fallback)
    q, k, v = _qkv(patches)
    with torch.inference_mode():
        ours, weights = vision_attention(_Module(), q, k, v, None, scaling=scaling)
        theirs, _ = sdpa_attention_forward(_Module(), q, k, v, None, scaling=scaling, is_causal=False)
    assert weights is None and ours.shape == theirs.shape == (1, patches, 3, 16)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    if patches > 1:  # the scale is applied: without it the softmax is sharper
        other, _ = vision_attention(_Module(), q, k, v, None, scaling=0.01)
        assert not torch.allclose(other, ours, atol=1e-3)


def test_masks_other_dtypes_and_causal_calls_go_to_sdpa(monkeypatch):
    from epd.engine import vision_attention as module

    calls = []
    monkeypatch.setattr(module, "sdpa_attention_forward", lambda *a, **kw: calls.append(kw) or (None, None))
    q, k, v = _qkv(8)
    vision_attention(_Module(), q, k, v, torch.ones(1, 1, 8, 8, dtype=torch.bool))
    vision_attention(_Module(), q, k, v, None, is_causal=True)
    vision_attention(_Module(), *_qkv(8, dtype=torch.bfloat16), None)
    assert len(calls) == 3
