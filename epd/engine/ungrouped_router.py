"""DeepSeek-V3's expert router without its group masking, where that masking keeps every expert.

The library's router first picks `topk_group` of `n_group` groups of experts and masks out the
rest: a dozen more operators a layer (a top-k over groups, a zeros, a scatter, an expand, a
`masked_fill`, ...). Kimi-K2.5 sets `n_group = topk_group = 1` (and so do our tiny checkpoints),
where the mask is all true and `masked_fill` returns the scores unchanged, so the top-k sees the
same values and returns the same experts in the same order: the output is the library's, bit for
bit. At a decode step those operators are dispatch and Python, not arithmetic (py-spy, Kimi small,
float32, batch 2: the router took 8% of a 13.7 ms step). A router that does choose among groups
keeps the library's forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from epd.models.rerouting import reroute

ROUTER_CLASSES = frozenset({"DeepseekV3TopkRouter"})  # transformers 5.24-5.25: forward as below, plus the mask


def takes(module: torch.nn.Module) -> bool:
    """A known router whose group mask selects every group; pure."""
    return (type(module).__name__ in ROUTER_CLASSES
            and all(hasattr(module, name) for name in ("num_group", "topk_group", "e_score_correction_bias"))
            and module.topk_group >= module.num_group)


def install(model: torch.nn.Module) -> int:
    """Switch every router in `model` that `takes` to `ungrouped_router_forward`; returns how many."""
    return reroute(model, takes, ungrouped_router_forward)


def ungrouped_router_forward(self, hidden_states: torch.Tensor):
    """hidden_states [..., D] -> (router_logits [N, E], topk_weights [N, k], topk_indices [N, k])."""
    hidden_states = hidden_states.view(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states.type(torch.float32), self.weight.type(torch.float32))
    scores = router_logits.sigmoid()
    topk_indices = torch.topk(scores + self.e_score_correction_bias, k=self.top_k, dim=-1, sorted=False)[1]
    topk_weights = scores.gather(1, topk_indices)
    if self.norm_topk_prob:
        topk_weights /= topk_weights.sum(dim=-1, keepdim=True) + 1e-20
    return router_logits, topk_weights * self.routed_scaling_factor, topk_indices
