"""A sequence's outputs reach its reader in the engine's order, also when they start arriving while the
reader still waits for the admission (the engine admitted, then stepped, between two looks)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from epd.engine.loop import Stream
from epd.engine.params import SamplingParams
from epd.engine.sequence import Sequence


def _stream() -> Stream:
    return Stream(Sequence(request_id="r", token_ids=[1, 2], num_prompt_tokens=2, params=SamplingParams(max_tokens=4)))


def test_outputs_queued_before_the_admission_is_seen_keep_their_order():
    stream = _stream()
    for token in ("first", "second", "third"):  # stand-ins for StepOutputs, put before `admitted` is seen
        stream.put(token)
    # The engine admitted and stepped it just as the reader's first wait timed out: that wait says no,
    # the next one yes.
    answers = iter([False, True])
    stream.admitted = SimpleNamespace(wait=lambda timeout: next(answers))
    stream.wait_admitted(2.0)
    assert [stream.get(1.0) for _ in range(3)] == ["first", "second", "third"]
    with pytest.raises(TimeoutError):
        stream.get(0.01)


def test_a_refusal_before_admission_is_raised():
    stream = _stream()
    stream.put(ValueError("no room"))
    with pytest.raises(ValueError, match="no room"):
        stream.wait_admitted(1.0)


def test_an_admitted_stream_reads_its_queue_in_order():
    stream = _stream()
    stream.admitted.set()
    stream.wait_admitted(1.0)
    stream.put("a")
    stream.put("b")
    assert [stream.get(1.0), stream.get(1.0)] == ["a", "b"]
