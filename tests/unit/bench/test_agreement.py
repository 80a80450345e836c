"""Outputs against the hf column's, request by request: token ids where both sides have them, else text."""

from epd.bench.agreement import Agreement, agreement, first_difference
from epd.bench.results import RequestResult


def result(index: int, ids: tuple[int, ...] | None, text: str = "", ok: bool = True) -> RequestResult:
    return RequestResult(index, ok, 0.0, output_text=text, output_ids=ids)


def test_equal_ids_and_where_unequal_ones_part():
    assert first_difference(result(0, (1, 2, 3)), result(0, (1, 2, 3))) is None
    assert first_difference(result(0, (1, 9, 3)), result(0, (1, 2, 3))) == "token 2 of 3"
    assert first_difference(result(0, (1, 2)), result(0, (1, 2, 3))) == "token 3 of 3"  # one ends early


def test_text_when_a_side_has_no_ids():
    assert first_difference(result(0, None, "a cat"), result(0, (5, 6), "a cat")) is None
    assert first_difference(result(0, None, "a cat"), result(0, (5, 6), "a dog")) == "text"
    # ids win where both have them, even if the texts differ (a server's detokenizer is not compared)
    assert first_difference(result(0, (5, 6), "a cat "), result(0, (5, 6), "a cat")) is None


def test_runs_pair_by_run_and_requests_by_index_and_failures_are_not_compared():
    reference = [[result(0, (1,)), result(1, (2,)), result(2, (3,), ok=False)],
                 [result(0, (4,)), result(1, (5,))]]
    ours = [[result(1, (2,)), result(0, (1,)), result(2, (3,))],  # out of order; 2 failed in the reference
            [result(0, (4,)), result(1, (7,)), result(2, (6,))]]  # 1 differs; 2 has no reference
    assert agreement(ours, reference) == Agreement(3, 4, 0, "run 2, request 1: token 1 of 1")


def test_text_only_comparisons_are_counted_and_marked():
    outcome = agreement([[result(0, None, "x"), result(1, (2,))]], [[result(0, (1,), "x"), result(1, (2,))]])
    assert outcome == Agreement(2, 2, 1, None)
    assert outcome.cell() == "2/2 text" and Agreement(2, 2, 0).cell() == "2/2"
