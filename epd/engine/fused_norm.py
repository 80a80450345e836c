"""The language model's RMSNorm layers as one native call each (epd/kernels/rms_norm.cpp).

The library's RMSNorm is seven operators (a float32 copy, its square, the mean, eps, rsqrt, the
product, the cast back, the weight): each small decode call pays seven dispatches, and a prompt
step's rows go seven times through memory. Installed on the known classes only, whose forward is
`weight * (x.float() * rsqrt(mean(x^2) + eps)).to(x.dtype)`; a variant (Gemma's `1 + weight`, say)
would need its own kernel, so an unknown class keeps its forward.
"""

from __future__ import annotations

import torch

from epd.models.rerouting import reroute

# transformers' classes whose forward is exactly the formula above (5.24-5.25)
RMS_NORM_CLASSES = frozenset({"Qwen3VLMoeTextRMSNorm", "DeepseekV3RMSNorm"})


def _is_known_rms_norm(module: torch.nn.Module) -> bool:
    return type(module).__name__ in RMS_NORM_CLASSES and hasattr(module, "variance_epsilon")


def install(model: torch.nn.Module) -> int:
    """Switch every known RMSNorm in `model` to `fused_rms_norm_forward`; returns how many."""
    return reroute(model, _is_known_rms_norm, fused_rms_norm_forward)


def fused_rms_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    """hidden_states [..., D] -> [..., D]; the class's own forward where the kernel does not apply."""
    if hidden_states.dtype != self.weight.dtype or hidden_states.device.type != "cpu":
        return type(self).forward(self, hidden_states)
    return torch.ops.epd.rms_norm(hidden_states.contiguous(), self.weight, self.variance_epsilon)
