"""A sequence's outputs reach its reader in the engine's order, also when they are queued before the
reader waits for the admission (the engine admitted, then stepped, before the reader looked), and a
refusal reaches whoever reads."""

from __future__ import annotations

import pytest

from epd.engine.loop import Stream
from epd.engine.params import SamplingParams
from epd.engine.sequence import Sequence


def _stream() -> Stream:
    return Stream(Sequence(request_id="r", token_ids=[1, 2], num_prompt_tokens=2, params=SamplingParams(max_tokens=4)))


def test_outputs_queued_before_the_admission_is_seen_keep_their_order():
    stream = _stream()
    stream.admit()
    for token in ("first", "second", "third"):  # stand-ins for StepOutputs, queued before the reader waits
        stream.put(token)
    stream.wait_admitted(2.0)
    assert [stream.get(1.0) for _ in range(3)] == ["first", "second", "third"]
    with pytest.raises(TimeoutError):
        stream.get(0.01)


def test_a_refusal_before_admission_is_raised():
    stream = _stream()
    stream.refuse(ValueError("no room"))
    with pytest.raises(ValueError, match="no room"):
        stream.wait_admitted(1.0)
    assert not stream.admitted


def test_an_admitted_stream_reads_its_queue_in_order():
    stream = _stream()
    stream.admit()
    stream.wait_admitted(1.0)
    stream.put("a")
    stream.put("b")
    assert [stream.get(1.0), stream.get(1.0)] == ["a", "b"]
