"""The vision towers' tanh-approximated GELU as one native call (epd/kernels/gelu_tanh.cpp).

MoonViT (Kimi-K2.5) and Qwen3-VL's ViT use transformers' `GELUTanh` between their MLP products.
ATen computes it through a 1-ulp tanh that costs about 12 cycles an element on an AVX2 Zen 3:
3.3-3.8 ms for one 448x448 image's [1024, 1024] activation on one thread, 5% of the image's
vision tower. The kernel computes the same function as x / (1 + e^(-2u)) in 0.5-0.75 ms; through
the encoder (8 images, one thread) Kimi small took 3.18-3.21 s against 3.30-3.43, Qwen small
2.42-2.46 against 2.55-2.64; in a 16-request burst through `epd serve` the encoder spent 6.8-7.3
CPU-s against 7.1-7.4. Its outputs differ from ATen's by a few units of float32's last place and
are nearer the exact value where ATen's 1 + tanh(u) cancels (negative x). Any input the kernel
does not take (another dtype, a GPU tensor) goes to the library's forward.
"""

from __future__ import annotations

import torch

from epd.engine.native_kernels import NATIVE_DTYPES
from epd.models.rerouting import reroute

GELU_TANH_CLASSES = frozenset({"GELUTanh"})  # transformers.activations (also named PytorchGELUTanh)


def _is_gelu_tanh(module: torch.nn.Module) -> bool:
    return type(module).__name__ in GELU_TANH_CLASSES


def fused_gelu_tanh_forward(self, x: torch.Tensor) -> torch.Tensor:
    """x [...] -> [...]; the class's own forward where the kernel does not apply."""
    if x.dtype not in NATIVE_DTYPES or x.device.type != "cpu":
        return type(self).forward(self, x)
    return torch.ops.epd.gelu_tanh(x.contiguous())


def install(model: torch.nn.Module) -> int:
    """Switch every GELUTanh in `model` to `fused_gelu_tanh_forward`; returns how many."""
    return reroute(model, _is_gelu_tanh, fused_gelu_tanh_forward)
