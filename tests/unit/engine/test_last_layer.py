"""epd.engine.last_layer's MLP: only the kept rows computed while a forward names them (model-free)."""

from __future__ import annotations

import torch

from epd.engine import last_layer


class _Counting(torch.nn.Module):
    """A per-row MLP that records how many rows each call saw."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.rows_seen: list[int] = []

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        self.rows_seen.append(hidden.shape[1])
        return torch.nn.functional.silu(self.proj(hidden))


def test_the_mlp_computes_only_the_kept_rows_and_zeros_the_rest():
    torch.manual_seed(0)
    mlp = _Counting()
    hidden = torch.randn(1, 6, 8)
    full = mlp(hidden)
    last_layer.install(mlp)
    rows = torch.tensor([1, 5])
    with last_layer.kept_rows(rows):
        pruned = mlp(hidden)
    assert mlp.rows_seen == [6, 2]
    torch.testing.assert_close(pruned[:, rows], full[:, rows])
    assert pruned[:, [0, 2, 3, 4]].abs().max() == 0


def test_without_kept_rows_the_mlp_computes_every_row():
    mlp = _Counting()
    last_layer.install(mlp)
    hidden = torch.randn(1, 4, 8)
    with last_layer.kept_rows(torch.tensor([0])):
        pass  # the context is over: every row again
    out = mlp(hidden)
    assert mlp.rows_seen == [4]
    torch.testing.assert_close(out, torch.nn.functional.silu(mlp.proj(hidden)))
