"""Give chosen submodules of a loaded model another forward, on the instance (the class stays as it is).

The engine's faster paths (absorbed latent attention, patch embeddings as one linear) keep the
library's modules and weights and change only how a module computes its output.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch


def reroute(model: torch.nn.Module, chosen: Callable[[torch.nn.Module], bool], forward: Callable) -> int:
    """Bind `forward` as the forward of every submodule for which `chosen` is true; returns how many."""
    count = 0
    for module in model.modules():
        if chosen(module):
            module.forward = types.MethodType(forward, module)
            count += 1
    return count
