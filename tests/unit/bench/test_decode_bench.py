"""epd bench decode's accounting: which weight bytes a step reads, experts counted from routing."""

from __future__ import annotations

import torch

from epd.bench.decode import DecodeBench, ExpertCounter, dense_weight_bytes, format_decode


class _Experts(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_up_proj = torch.nn.Parameter(torch.zeros(4, 6, 3))  # [E, 2I, H]
        self.down_proj = torch.nn.Parameter(torch.zeros(4, 3, 3))  # [E, H, I]

    def forward(self, hidden, top_k_index, top_k_weights):
        return hidden


class _Model(torch.nn.Module):
    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 3)
        self.proj = torch.nn.Linear(3, 3, bias=False)
        self.experts = _Experts()
        self.lm_head = torch.nn.Linear(3, 10, bias=False)
        if tied:
            self.lm_head.weight = self.embed.weight


def test_dense_bytes_leave_out_experts_and_the_embedding_table():
    assert dense_weight_bytes(_Model(tied=False)) == (9 + 30) * 4


def test_a_tied_lm_head_is_read_whole():
    assert dense_weight_bytes(_Model(tied=True)) == (9 + 30) * 4


def test_experts_hit_are_counted_once_per_step():
    model = _Model(tied=False)
    counter = ExpertCounter(model)
    model.experts(torch.zeros(3, 3), torch.tensor([[0, 1], [1, 2], [0, 1]]), None)
    per_expert = (6 * 3 + 3 * 3) * 4
    assert counter.take() == 3 * per_expert
    assert counter.take() == 0
    counter.close()
    model.experts(torch.zeros(1, 3), torch.tensor([[3, 2]]), None)
    assert counter.take() == 0  # hooks removed


def test_fraction_of_the_bound():
    r = DecodeBench(batch=8, context=10, step_ms=10.0, tokens_per_s=800.0, weight_bytes_per_step=1e8,
                    kv_bytes_per_step=0.0, read_gb_per_s=10.0, bound_tokens_per_s=800.0)
    assert r.fraction_of_bound == 1.0 and r.to_dict()["fraction_of_bound"] == 1.0


def test_the_report_says_which_forward_ran():
    r = DecodeBench(batch=2, context=10, step_ms=10.0, tokens_per_s=200.0, weight_bytes_per_step=1e8,
                    kv_bytes_per_step=0.0, read_gb_per_s=10.0, bound_tokens_per_s=200.0, forward="direct")
    assert format_decode(r).startswith("decode at batch 2, context 10 (direct forward): 10.0 ms per step")
    assert r.to_dict()["forward"] == "direct"
