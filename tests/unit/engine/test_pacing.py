"""Decode pacing: when a step waits, and for how long (pure)."""

from __future__ import annotations

import pytest

from epd.engine.pacing import DecodePacing

PACING = DecodePacing(interval_s=0.15, busy_threshold=0.5)


def test_a_decode_step_on_shared_cores_waits_out_the_rest_of_its_interval():
    assert PACING.pause_s(0.04, decode_only=True, batch=3, max_batch=64, others_busy=1.2) == pytest.approx(0.11)


def test_a_step_longer_than_the_interval_does_not_wait():
    assert PACING.pause_s(0.2, decode_only=True, batch=3, max_batch=64, others_busy=1.2) == 0.0


def test_cores_that_others_leave_alone_never_wait():
    assert PACING.pause_s(0.04, decode_only=True, batch=3, max_batch=64, others_busy=0.5) == 0.0
    assert PACING.pause_s(0.04, decode_only=True, batch=3, max_batch=64, others_busy=0.0) == 0.0


def test_prompts_to_prefill_an_empty_or_a_full_batch_never_wait():
    assert PACING.pause_s(0.04, decode_only=False, batch=3, max_batch=64, others_busy=2.0) == 0.0
    assert PACING.pause_s(0.04, decode_only=True, batch=0, max_batch=64, others_busy=2.0) == 0.0
    assert PACING.pause_s(0.04, decode_only=True, batch=64, max_batch=64, others_busy=2.0) == 0.0


def test_interval_zero_is_off_and_negative_is_refused():
    assert DecodePacing(0.0).pause_s(0.01, decode_only=True, batch=1, max_batch=64, others_busy=2.0) == 0.0
    with pytest.raises(ValueError, match=">= 0"):
        DecodePacing(-0.1)


def test_the_flag_builds_pacing_only_on_a_cpu():
    import argparse

    import torch

    from epd.engine_args import decode_pacing

    def flag(ms: int) -> argparse.Namespace:
        return argparse.Namespace(decode_step_interval_ms=ms)

    assert decode_pacing(flag(150), torch.device("cpu")) == DecodePacing(0.15)
    assert decode_pacing(flag(0), torch.device("cpu")) is None
    assert decode_pacing(flag(150), torch.device("cuda", 0)) is None
    with pytest.raises(ValueError, match="--decode-step-interval-ms must be >= 0"):
        decode_pacing(flag(-5), torch.device("cpu"))
