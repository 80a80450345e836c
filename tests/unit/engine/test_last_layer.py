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


def test_a_projection_to_another_width_keeps_its_width():
    proj = torch.nn.Linear(8, 12)
    hidden = torch.randn(1, 5, 8)
    full = proj(hidden)
    last_layer.install(proj)
    with last_layer.kept_rows(torch.tensor([4])):
        pruned = proj(hidden)
    assert pruned.shape == (1, 5, 12)
    torch.testing.assert_close(pruned[:, 4], full[:, 4])
    assert pruned[:, :4].abs().max() == 0


def _fake_model(layers: int = 2) -> torch.nn.Module:
    """model.model.language_model.layers, as install_last finds a ForConditionalGeneration's."""
    from types import SimpleNamespace

    def layer(index: int) -> torch.nn.Module:
        attn = torch.nn.Module()
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(attn, name, torch.nn.Linear(8, 8))
        attn.layer_idx = index
        block = torch.nn.Module()
        block.self_attn, block.mlp = attn, _Counting()
        return block

    text = torch.nn.Module()
    text.layers = torch.nn.ModuleList(layer(i) for i in range(layers))
    text.config = SimpleNamespace(num_hidden_layers=layers)
    model, inner = torch.nn.Module(), torch.nn.Module()
    inner.language_model = text
    model.model = inner
    return model


def test_install_last_prunes_the_last_layers_queries_output_and_mlp_never_its_keys_or_values():
    model = _fake_model()
    assert last_layer.install_last(model) == 1
    last, first = model.model.language_model.layers[1], model.model.language_model.layers[0]
    hidden = torch.randn(1, 4, 8)
    with last_layer.kept_rows(torch.tensor([3])):
        for name in ("q_proj", "o_proj"):
            assert getattr(last.self_attn, name)(hidden)[:, :3].abs().max() == 0, name
        for name in ("k_proj", "v_proj"):  # every token's key and value goes to the cache
            torch.testing.assert_close(getattr(last.self_attn, name)(hidden),
                                       torch.nn.functional.linear(hidden, getattr(last.self_attn, name).weight,
                                                                  getattr(last.self_attn, name).bias))
        assert last.mlp(hidden)[:, :3].abs().max() == 0
        assert first.mlp(hidden)[:, :3].abs().max() > 0  # earlier layers: every row
    assert last_layer.install_last(torch.nn.Linear(2, 2)) is None  # another layout: nothing pruned
