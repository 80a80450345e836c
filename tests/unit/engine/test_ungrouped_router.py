"""The router without DeepSeek-V3's group mask against the library's forward (random weights and
biases, no checkpoint): the same experts in the same order and the same weights, bit for bit, where
every group is chosen; a router that chooses among groups keeps the library's forward."""

from __future__ import annotations

import pytest
import torch
from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

from epd.engine import ungrouped_router


def _router(n_group: int, topk_group: int, norm_topk_prob: bool = True, experts: int = 16) -> DeepseekV3TopkRouter:
    config = DeepseekV3Config(hidden_size=64, n_routed_experts=experts, num_experts_per_tok=4, n_group=n_group,
                              topk_group=topk_group, norm_topk_prob=norm_topk_prob, routed_scaling_factor=2.5)
    router = DeepseekV3TopkRouter(config)
    generator = torch.Generator().manual_seed(experts + n_group)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=generator))
        router.e_score_correction_bias.copy_(torch.randn(experts, generator=generator) * 0.1)
    return router


@pytest.mark.parametrize("norm_topk_prob", [True, False])
@pytest.mark.parametrize("rows", [1, 2, 7, 300])
def test_equals_the_library_bit_for_bit_when_every_group_is_chosen(rows, norm_topk_prob):
    router = _router(n_group=1, topk_group=1, norm_topk_prob=norm_topk_prob)
    hidden = torch.randn(1, rows, 64, generator=torch.Generator().manual_seed(rows))
    with torch.inference_mode():
        expected = DeepseekV3TopkRouter.forward(router, hidden)
        assert ungrouped_router.install(router) == 1
        got = router(hidden)
    for ours, theirs in zip(got, expected, strict=True):
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        assert torch.equal(ours, theirs)


def test_ties_between_experts_resolve_as_the_library_resolves_them():
    router = _router(n_group=1, topk_group=1)
    with torch.no_grad():
        router.weight.zero_()  # every score 0.5: the choice is the bias's, and among equal biases topk's
        router.e_score_correction_bias.copy_(torch.tensor([0.0, 1.0] * 8))
    hidden = torch.randn(3, 64)
    with torch.inference_mode():
        expected = DeepseekV3TopkRouter.forward(router, hidden)
        ungrouped_router.install(router)
        got = router(hidden)
    assert torch.equal(got[2], expected[2]) and torch.equal(got[1], expected[1])


def test_all_groups_chosen_among_several_is_also_ungrouped():
    assert ungrouped_router.takes(_router(n_group=4, topk_group=4))


def test_a_router_that_chooses_among_groups_keeps_the_library_forward():
    router = _router(n_group=4, topk_group=2)
    assert not ungrouped_router.takes(router)
    assert ungrouped_router.install(router) == 0
    assert "forward" not in vars(router)


def test_other_modules_are_left_alone():
    assert not ungrouped_router.takes(torch.nn.Linear(4, 4))
