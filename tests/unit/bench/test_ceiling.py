"""epd bench ceiling's arithmetic: the front end's CPU-seconds spread over the cores, plus the decode floor
(or the engine's own decode steps for the last tokens)."""

from __future__ import annotations

import pytest

from epd.bench.ceiling import Ceiling, format_ceiling


def _ceiling(**overrides) -> Ceiling:
    fields = {"requests": 4, "output_len": 10, "cores": 2, "hf_wall_s": 8.0,
              "front_end_cpu_s": (0.5, 0.5, 1.0, 1.0), "decode_floor_s": 0.5, "tail_step_s": 0.05}
    return Ceiling(**{**fields, **overrides})


def test_the_fastest_wall_time_spreads_the_front_end_over_the_cores_and_adds_the_decode_floor():
    c = _ceiling()
    assert c.front_end_wall_s == pytest.approx(1.5)  # 3 CPU-s over 2 cores
    assert c.min_wall_s == pytest.approx(2.0)
    assert c.max_ratio == pytest.approx(4.0)
    assert c.max_ratio_free_decode == pytest.approx(8.0 / 1.5)
    assert c.hf_tok_per_s == pytest.approx(40 / 8.0)


def test_more_cores_raise_the_ceiling_and_a_dearer_front_end_lowers_it():
    assert _ceiling(cores=4).max_ratio == pytest.approx(8.0 / (0.75 + 0.5))
    assert _ceiling(front_end_cpu_s=(1.0,) * 4).max_ratio == pytest.approx(8.0 / 2.5)


def test_the_report_and_json_carry_the_ratios():
    c = _ceiling()
    assert "at most 4.00x" in format_ceiling(c)
    assert "5.33x if decoding were free" in format_ceiling(c)
    assert c.to_dict()["max_ratio"] == pytest.approx(4.0)


def test_the_engine_figure_adds_one_batch_step_per_token_after_the_first_to_the_front_end():
    c = _ceiling()
    assert c.engine_wall_s == pytest.approx(1.5 + 9 * 0.05)  # the prompt forward made the first token
    assert c.engine_ratio == pytest.approx(8.0 / 1.95)
    assert _ceiling(output_len=1).engine_wall_s == pytest.approx(c.front_end_wall_s)
    assert c.to_dict()["engine_ratio"] == pytest.approx(8.0 / 1.95)
    assert "50.0 ms at batch 4, 1 thread): front end + 9 steps = 1.95 s -> 4.10x" in format_ceiling(c)
