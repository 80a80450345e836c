"""The vision tower's attention in float32 as two oneDNN products per head (epd.engine.onednn_linear).

A vision tower attends bidirectionally within each image; the library hands its attention function
one image at a time (queries, keys and values [1, H, n, d]). torch's SDPA runs that as a flash
attention whose inner products are MKL's, on a CPU not made by Intel its AVX2 code: on an AVX-512
Zen 5 it was a third of a Kimi small tower's time (103 of 294 ms an image, one thread), at 94
GFLOP/s. Here each head is scores = (q * scale) k^T, softmax over the keys, then probs v, the two
products through oneDNN and the softmax in place (epd/kernels/softmax_rows.cpp: ATen's wrote a new
[n, n] tensor after a fill of the padded keys' columns, 434 against 208 us a [1024, 1024] head, one
thread); a head's scores (4 MiB at a 1024-patch image) stay in the L2/L3 cache between the three
steps. The sums run in another order than SDPA's, so the output differs from the library's by a
few units in float32's last place, as the tower's oneDNN linears already do.

Anything else the interface may be asked (a mask, causal, dropout, another dtype or device, a batch
of several) goes to the library's SDPA function.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from epd.engine.onednn_linear import linear, padded_rows

NAME = "epd_vision_onednn"


def vision_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     is_causal: bool = False, **kwargs) -> tuple[torch.Tensor, None]:
    """query / key [1, H, n, d], value [1, H, n, dv] -> ([1, n, H, dv], None), as the library's SDPA function."""
    if (attention_mask is not None or is_causal or dropout or query.shape[0] != 1 or query.device.type != "cpu"
            or not query.dtype == key.dtype == value.dtype == torch.float32):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      is_causal=is_causal, **kwargs)
    _, heads, patches, head_dim = query.shape
    scale = head_dim ** -0.5 if scaling is None else scaling
    # Keys padded with zero rows to the encoder's row buckets (onednn_linear.padded_rows: oneDNN keeps
    # memory for every product shape it meets), their scores masked out, so their values never count.
    keys = padded_rows(patches, fine=True)
    if keys != patches:
        pad = (0, 0, 0, keys - patches)
        key, value = F.pad(key, pad), F.pad(value, pad)  # [1, H, n', d], [1, H, n', dv]
    query = query[0] * scale  # [H, n, d]
    out = query.new_empty(patches, heads, value.shape[-1])  # [n, H, dv]
    for head in range(heads):
        # A head's keys and values are strided views; `linear` gives oneDNN contiguous copies of them.
        scores = linear(query[head], key[0, head], fine=True)  # [n, n']
        probs = torch.ops.epd.softmax_rows_(scores, patches)  # [n, n'] in place, the padded keys' columns 0
        out[:, head] = linear(probs, value[0, head].t(), fine=True)  # [n, dv]
    return out.unsqueeze(0), None


def install(model: PreTrainedModel) -> None:
    """Register `vision_attention` and set it on `model`'s vision config (the encoder role's model, a
    composite whose language side is dropped), the library's own switch."""
    AttentionInterface.register(NAME, vision_attention)
    model.set_attn_implementation({"vision_config": NAME})
