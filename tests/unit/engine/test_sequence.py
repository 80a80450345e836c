"""Sequence: stop conditions, counts, content keys, stop-id sets."""

from __future__ import annotations

import pytest

from epd.engine.params import SamplingParams
from epd.engine.sequence import Finish, ImageSpan, Sequence, stop_ids
from tests.unit.engine.helpers import seq

EOS = 9


def feed(s: Sequence, tokens: list[int]) -> list[Finish | None]:
    return [s.append(t) for t in tokens]


def test_stops_on_eos_and_keeps_it():
    s = seq("a", 3, max_tokens=16, stop=frozenset({EOS}))
    assert feed(s, [3, 4, EOS]) == [None, None, Finish.STOP]
    assert s.token_ids[3:] == [3, 4, EOS] and s.num_generated == 3


def test_any_stop_id_stops():
    s = seq("a", 3, stop=frozenset({EOS, 5}))
    assert feed(s, [5]) == [Finish.STOP]


def test_stops_on_max_tokens():
    s = seq("a", 3, max_tokens=2)
    assert feed(s, [1, 2]) == [None, Finish.LENGTH]


def test_a_stop_token_on_the_last_allowed_position_is_stop():
    s = seq("a", 3, max_tokens=2, stop=frozenset({EOS}))
    assert feed(s, [1, EOS]) == [None, Finish.STOP]


def test_the_context_length_ends_with_length():
    s = Sequence("a", [1, 2, 3], 3, SamplingParams(max_tokens=100), max_model_len=5)
    assert feed(s, [4, 5]) == [None, Finish.LENGTH]
    assert s.max_total_tokens == 5


def test_handoff_after_the_first_token_unless_it_already_ended():
    assert seq("a", 3, handoff=True).append(4) is Finish.HANDOFF
    assert seq("b", 3, handoff=True, stop=frozenset({EOS})).append(EOS) is Finish.STOP
    assert seq("c", 3, max_tokens=1, handoff=True).append(4) is Finish.LENGTH


def test_counts():
    s = seq("a", 5)
    s.num_computed_tokens = 2
    assert (s.num_tokens, s.num_pending, s.is_prefilling, s.num_generated) == (5, 3, True, 0)
    s.num_computed_tokens = 4
    assert not s.is_prefilling


def test_image_tokens_are_keyed_by_digest_and_offset():
    s = seq("a", [1, 9, 9, 9, 2], images=(ImageSpan(1, 3, "abc"),))
    assert [s.content_key(i) for i in range(5)] == [1, ("abc", 0), ("abc", 1), ("abc", 2), 2]
    assert s.block_content(1, 2) == (("abc", 1), ("abc", 2))


def test_stop_ids_honour_ignore_eos():
    assert stop_ids(SamplingParams(), [9], [4]) == {4, 9}
    assert stop_ids(SamplingParams(ignore_eos=True), [9], [4]) == {4}


@pytest.mark.parametrize("prompt", [0, 4])
def test_prompt_length_must_be_within_the_tokens(prompt):
    with pytest.raises(ValueError):
        Sequence("a", [1, 2, 3], prompt, SamplingParams())
