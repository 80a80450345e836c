"""The direct decode forward's pure pieces: which steps it takes, the positions Qwen's text model sees,
and what its build refuses (a model of parts it does not know)."""

from __future__ import annotations

import pytest
import torch

from epd.engine.direct_decode import DirectDecode, NotDirect, _qwen_text_positions


def _direct(placeholders: frozenset[int]) -> DirectDecode:
    return DirectDecode(embedding=None, rotary=None, positions=None, layers=(), norm=None, head=None,
                        placeholder_ids=placeholders)


def test_steps_with_a_placeholder_id_go_through_the_modules():
    direct = _direct(frozenset({7, 9}))
    assert direct.takes([1, 2, 3])
    assert not direct.takes([1, 9, 3])  # Kimi embeds these as id 0: only the module path does
    assert _direct(frozenset()).takes([7, 9])


def test_qwen_positions_are_the_three_mrope_rows_its_text_model_hands_on():
    three = torch.arange(12).view(3, 1, 4)  # [rows, batch, T]: what the engine passes
    assert _qwen_text_positions(three) is three
    four = torch.arange(16).view(4, 1, 4)  # a leading text row: dropped
    assert torch.equal(_qwen_text_positions(four), four[1:])
    flat = torch.tensor([[5, 6, 7]])  # [batch, T]: one row for all three
    assert torch.equal(_qwen_text_positions(flat), flat.expand(3, 1, 3))


def test_a_model_of_unknown_parts_is_refused_with_the_reason():
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.language_model = torch.nn.Linear(2, 2)
    with pytest.raises(NotDirect, match="no direct decode forward for Linear"):
        DirectDecode.build(model)
