"""`epd bench compare`'s orchestration and ratios, with stand-in columns (no model, no server)."""

from __future__ import annotations

import contextlib

import pytest

from epd.bench.compare import CompareConfig, CompareResult, ConfigResult, _Column, run_compare
from epd.bench.results import RequestResult
from epd.bench.stats import median_ratios, paired_ratios, summarize
from epd.bench.workloads import WorkloadSpec


class Recording(_Column):
    """A column that logs what happens to it; `fails` makes it unavailable at open."""

    def __init__(self, label: str, log: list, fails: bool = False) -> None:
        self.result = ConfigResult(label, label)
        self.log, self.fails = log, fails

    def open(self, stack: contextlib.ExitStack) -> bool:
        self.log.append(("open", self.result.label))
        if self.fails:
            self.result.unavailable = "cannot start"
            return False
        stack.callback(self.log.append, ("close", self.result.label))
        return True

    def run(self, r: int, requests) -> None:
        self.log.append((f"run{r}", self.result.label))


def config(interleave: bool) -> CompareConfig:
    return CompareConfig(model_dir="/m", workload=WorkloadSpec("text"), requests=2, runs=2, interleave=interleave)


def test_interleaved_runs_go_round_the_columns_before_the_next_run_every_other_round_backwards():
    log: list = []
    columns = [Recording("hf", log), Recording("broken", log, fails=True), Recording("cluster", log)]
    result = run_compare(config(interleave=True), columns)
    assert log == [("open", "hf"), ("open", "broken"), ("open", "cluster"),
                   ("run0", "hf"), ("run0", "cluster"), ("run1", "cluster"), ("run1", "hf"),
                   ("close", "cluster"), ("close", "hf")]
    assert [c.label for c in result.columns] == ["hf", "broken", "cluster"]
    assert result.column("broken").unavailable == "cannot start"


def test_sequential_runs_open_and_close_each_column_in_turn():
    log: list = []
    run_compare(config(interleave=False), [Recording("hf", log), Recording("cluster", log)])
    assert log == [("open", "hf"), ("run0", "hf"), ("run1", "hf"), ("close", "hf"),
                   ("open", "cluster"), ("run0", "cluster"), ("run1", "cluster"), ("close", "cluster")]


def test_paired_ratios_pair_runs_and_skip_missing_ones():
    assert paired_ratios([20.0, 40.0, 90.0], [10.0, 10.0, 30.0]) == [2.0, 4.0, 3.0]
    assert paired_ratios([20.0, None, 60.0], [10.0, 10.0, 0.0]) == [2.0]  # run 2 missing, run 3 base 0
    assert paired_ratios([None], [1.0]) == []
    assert paired_ratios([], []) == []


def test_median_ratios_take_each_columns_median_and_none_where_no_run_paired():
    assert median_ratios({"cluster": [2.0, 4.0, 3.0], "down": []}) == {"cluster": 3.0, "down": None}


def _column(label: str, walls: list[float]) -> ConfigResult:
    """A column whose run r produced 10 tokens in walls[r] seconds."""
    column = ConfigResult(label, label)
    column.summaries = [summarize([RequestResult(0, True, 0.0, 0.1, w, (), 10)], wall_s=w) for w in walls]
    return column


def test_ratios_are_the_median_of_each_runs_ratio_not_the_ratio_of_medians():
    # The machine slows down run by run (hf: 10, 5, 2.5 tok/s); in the same run the cluster makes
    # 2x, 3x and 2.2x hf's tokens/s. The ratio of the medians (15 / 5 = 3) would be the best run's.
    hf, cluster = _column("hf", [1.0, 2.0, 4.0]), _column("cluster", [10 / 20, 10 / 15, 10 / 5.5])
    result = CompareResult(config(interleave=True), [hf, cluster])
    ratios = result.ratios("hf")
    assert ratios["hf"] == 1.0
    assert ratios["cluster"] == pytest.approx(2.2)
    assert result.ratios("colocated") is None
    assert result.ratio_runs("hf")["cluster"] == pytest.approx([2.0, 3.0, 2.2])
    assert result.to_dict()["ratios_by_run"]["output_tok_per_s / hf"]["cluster"] == pytest.approx([2.0, 3.0, 2.2])
    assert result.ratio_runs("colocated") is None
