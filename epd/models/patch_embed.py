"""Patch embeddings as one matrix multiply.

Vision towers (MoonViT, Qwen3-VL's ViT) embed patches with a convolution whose kernel equals its
stride, applied to inputs that are already single patches: each output is one dot product of a
flattened patch with a flattened kernel. On CPU the convolution path costs several times the
equivalent `linear` (17 of 116 ms per 448x448 image for the small Qwen3-VL tower in float32, 39 of
87 ms in bfloat16), so `install` reroutes those calls; any other input goes to the convolution.
The encoder passes oneDNN's product in float32 (epd.engine.onednn_linear): MKL runs its AVX2 code
on CPUs not made by Intel (a 784-patch Qwen image's embedding: 8.4 ms on one Zen 5 thread).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from epd.models.rerouting import reroute


def _is_patchify(conv: torch.nn.Module) -> bool:
    if not isinstance(conv, torch.nn.Conv2d | torch.nn.Conv3d):
        return False
    return (tuple(conv.kernel_size) == tuple(conv.stride) and not any(conv.padding if isinstance(conv.padding, tuple)
            else (1,)) and all(d == 1 for d in conv.dilation) and conv.groups == 1)


Product = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]  # (x, weight, bias), as F.linear


def _patch_forward(self, x: torch.Tensor, product: Product = F.linear) -> torch.Tensor:
    """x [N, C, *kernel] -> [N, E, 1, ...] (what the convolution gives), as flat patches @ flat kernels."""
    if tuple(x.shape[2:]) != tuple(self.kernel_size):
        return type(self).forward(self, x)
    out = product(x.reshape(x.shape[0], -1), self.weight.reshape(self.out_channels, -1), self.bias)  # [N, E]
    return out.view(x.shape[0], self.out_channels, *([1] * len(self.kernel_size)))


def install(model: torch.nn.Module, product: Product = F.linear) -> int:
    """Reroute every patchifying convolution in `model` to `product`; returns how many."""
    return reroute(model, _is_patchify, lambda self, x: _patch_forward(self, x, product))
