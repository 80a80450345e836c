"""The comparison table and run report: columns, ratio rows, unavailable configurations."""

from epd.bench.compare import CompareConfig, CompareResult, ConfigResult
from epd.bench.load import LoadConfig, LoadResult
from epd.bench.report import fmt, format_compare, format_run, run_json
from epd.bench.results import RequestResult
from epd.bench.stats import Slo, summarize
from epd.bench.workloads import WorkloadSpec


def column(label: str, tokens_per_request: list[int], wall_s: float) -> ConfigResult:
    runs = [[RequestResult(i, True, 0.0, 0.1, 0.5, (0.1,) * (n - 1), n) for i, n in enumerate(tokens_per_request)]]
    return ConfigResult(label, f"{label} detail", [summarize(r, wall_s) for r in runs], runs)


def comparison(*columns: ConfigResult) -> CompareResult:
    return CompareResult(CompareConfig(model_dir="/m", workload=WorkloadSpec("image-1"), runs=1), list(columns))


def test_table_has_a_column_per_configuration_and_ratio_rows():
    result = comparison(column("hf", [4, 4], 1.0), column("colocated", [4, 4], 0.5), column("cluster", [4, 4], 0.25))
    table = format_compare(result)
    header = table.splitlines()[1].split()
    assert header == ["hf", "colocated", "cluster"]
    rows = {line.split("  ")[0]: line.split()[-3:] for line in table.splitlines()[2:] if line and line[0] != " "}
    assert rows["output tok/s"] == ["8", "16", "32"]
    assert rows["tok/s ÷ hf"] == ["1.00", "2.00", "4.00"]
    assert rows["tok/s ÷ colocated"] == ["0.50", "1.00", "2.00"]
    assert rows["failures"] == ["0", "0", "0"]


def test_an_unavailable_configuration_is_a_column_of_n_a_with_its_reason():
    broken = ConfigResult("colocated", "epd serve --colocated", unavailable="unrecognized arguments: --colocated")
    result = comparison(column("hf", [4], 1.0), broken)
    table = format_compare(result)
    assert "n/a" in table
    assert "colocated unavailable: unrecognized arguments: --colocated" in table
    assert result.ratios("colocated") is None
    assert result.ratios("hf") == {"hf": 1.0, "colocated": None}
    assert result.to_dict()["columns"][1]["median"] is None


def test_a_row_says_how_many_outputs_equal_hf_and_where_the_first_difference_is():
    def outputs(label: str, ids: list[tuple[int, ...]]) -> ConfigResult:
        runs = [[RequestResult(i, True, 0.0, 0.1, 0.5, (), 2, output_ids=x) for i, x in enumerate(ids)]]
        return ConfigResult(label, "", [summarize(r, 1.0) for r in runs], runs)

    result = comparison(outputs("hf", [(1, 2), (3, 4)]), outputs("cluster", [(1, 2), (3, 5)]),
                        ConfigResult("vllm", "", unavailable="down"))
    table = format_compare(result)
    row = next(line for line in table.splitlines() if line.startswith("same output as hf"))
    assert row.split()[-2:] == ["1/2", "n/a"]
    assert "cluster differs from hf first at run 1, request 1: token 2 of 2" in table
    assert result.to_dict()["same_output_as_hf"] == {
        "cluster": {"equal": 1, "compared": 2, "by_text": 0, "first_difference": "run 1, request 1: token 2 of 2"},
        "vllm": None}


def test_ratio_and_same_output_rows_only_for_bases_in_the_table():
    result = comparison(column("127.0.0.1:18555", [4], 1.0))
    table = format_compare(result)
    assert "÷" not in table and "same output" not in table
    assert result.agreements() is None and result.to_dict()["same_output_as_hf"] == {}


def test_a_row_gives_the_range_of_the_per_run_ratios_when_there_are_several_runs():
    def runs(label: str, walls: list[float]) -> ConfigResult:
        per_run = [[RequestResult(0, True, 0.0, 0.1, 0.5, (), 10)] for _ in walls]
        return ConfigResult(label, "", [summarize(r, w) for r, w in zip(per_run, walls, strict=True)], per_run)

    # hf 10, 5, 2.5 tok/s; the cluster 2x, 3x and 2.2x that in the same runs.
    result = CompareResult(CompareConfig(model_dir="/m", workload=WorkloadSpec("image-1"), runs=3),
                           [runs("hf", [1.0, 2.0, 4.0]), runs("cluster", [10 / 20, 10 / 15, 10 / 5.5])])
    lines = format_compare(result).splitlines()
    assert next(line for line in lines if line.startswith("tok/s ÷ hf  ")).split()[-1] == "2.20"
    assert next(line for line in lines if line.startswith("tok/s ÷ hf, range of runs")).split()[-1] == "2.00-3.00"
    single = format_compare(comparison(column("hf", [4], 1.0), column("cluster", [4], 0.5)))
    assert "range of runs" not in single  # one run has no spread to show


def test_medians_over_runs():
    runs = [[RequestResult(0, True, 0.0, 0.1, 0.5, (), 4)] for _ in range(3)]
    col = ConfigResult("x", "", [summarize(r, w) for r, w in zip(runs, (1.0, 2.0, 4.0), strict=True)], runs)
    assert col.figures["output_tok_per_s"] == 2.0  # of 4, 2, 1


def test_run_report_and_json():
    config = LoadConfig(url="http://h:1", workload=WorkloadSpec("text"), requests=2, output_len=3)
    results = [RequestResult(0, True, 0.0, 0.1, 0.3, (0.1, 0.1), 3),
               RequestResult(1, False, 0.0, e2e_s=0.1, status=429, error="HTTP 429: busy")]
    load = LoadResult(config, "m", results, wall_s=1.0)
    summary = load.summary(Slo(ttft_ms=500))
    text = format_run(load, summary)
    assert "succeeded 1/2" in text and "goodput 1 req/s under ttft_ms <= 500" in text
    assert "failed x1: HTTP 429: busy" in text
    data = run_json(load, summary)
    assert data["summary"]["output_tokens"] == 3 and data["figures"]["failures"] == 1.0
    assert [r["ok"] for r in data["results"]] == [True, False]


def test_fmt():
    assert [fmt(None), fmt(1234.5), fmt(42.0), fmt(12.34), fmt(1.234)] == ["-", "1234", "42", "12.3", "1.23"]


def test_cpu_rows_show_each_role_per_request_for_the_servers_compare_started():
    cluster = column("cluster", [4, 4], 0.25)
    cluster.cpu_per_request = [{"decode": 0.5, "encoder": 0.25, "router": 0.125},
                               {"decode": 0.75, "encoder": 0.25, "router": 0.125},
                               {"decode": 0.25, "encoder": 0.5, "router": 0.125}]
    table = format_compare(comparison(column("hf", [4, 4], 1.0), cluster))
    rows = {line.split("  ")[0]: line.split()[-1] for line in table.splitlines()[2:] if line.startswith("CPU-s")}
    assert list(rows) == ["CPU-s/request router", "CPU-s/request encoder", "CPU-s/request decode",
                          "CPU-s/request, all"]  # the request's path, in order
    assert rows["CPU-s/request decode"] == "0.50" and rows["CPU-s/request encoder"] == "0.25"  # medians
    assert rows["CPU-s/request, all"] == "0.88"
    assert cluster.to_dict()["cpu_s_per_request"] == {"decode": 0.5, "encoder": 0.25, "router": 0.125}


def test_no_cpu_rows_where_nothing_was_sampled():
    table = format_compare(comparison(column("hf", [4], 1.0), column("cluster", [4], 0.5)))
    assert "CPU-s" not in table
