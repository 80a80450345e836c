"""Redraw a freshly built model's weights so that greedy output varies from token to token.

At transformers' default initialisation (std 0.02) these small models collapse onto one token and
repeat it forever; an equality test on such output could not fail. Drawing every matrix at roughly
unit-variance scale (std = 2 / sqrt(fan_in)) keeps activations alive through the layers; at 1.5
the Kimi family still fell into repeats after ~10 tokens, at 2.0 40 greedy tokens are nearly all distinct.
"""

from __future__ import annotations

import torch
from torch import nn

_GAIN = 2.0


@torch.no_grad()
def redraw_weights(model: nn.Module, seed: int) -> None:
    """In place: matrices ~ N(0, (gain/sqrt(fan_in))^2), embeddings ~ N(0, 1), norms 1, biases 0."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if param.ndim >= 2:
            # Fused experts are [E, out, in] (or [E, in, out]); fan_in is the contracted dim either way
            # up to a constant factor, so use the last dim: what nn.Linear ([out, in]) would use.
            fan_in = param.shape[-1] if "embed" not in name else 1
            std = _GAIN / fan_in**0.5 if fan_in > 1 else 1.0
            param.copy_(torch.randn(param.shape, generator=gen) * std)
        elif "norm" in name or name.endswith("weight"):
            param.fill_(1.0)
        else:
            param.zero_()
    for name, buf in model.named_buffers():
        # Router score-correction biases (DeepSeek-V3's e_score_correction_bias) start at zero.
        if "bias" in name:
            buf.zero_()
