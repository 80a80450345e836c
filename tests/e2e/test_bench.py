"""`epd bench` against a real loopback server: the OpenAI-style stub in openai_stub.py.

The stub generates tokens at a known pace and reports usage, so the figures the load generator
prints can be checked exactly (counts) or for sense (rates > 0); compare runs the transformers
baseline on a tiny generated checkpoint beside it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from epd import cli
from epd.bench.load import LoadConfig, run_load
from epd.bench.workloads import WorkloadSpec
from epd.tiny.writer import make_tiny_model
from tests.e2e.openai_stub import MODEL, StubServer


@pytest.fixture()
def stub():
    with StubServer() as server:
        yield server


def images_in(body: dict) -> int:
    return sum(part.get("type") == "image_url" for message in body["messages"] for part in message["content"])


def test_bench_run_reports_exact_counts_and_writes_a_plot(stub, tmp_path):
    png = tmp_path / "cdf.png"
    command = [sys.executable, "-m", "epd", "bench", "run", "--url", f"{stub.url}/v1", "--workload", "image-1",
               "--requests", "6", "--concurrency", "3", "--output-len", "5", "--background", "text:1",
               "--slo", "ttft_ms=10000", "--json", "--plot", str(png)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    summary = report["summary"]
    assert (report["model"], summary["requests"], summary["succeeded"], summary["failures"]) == (MODEL, 6, 6, 0)
    assert summary["output_tokens"] == 30
    assert summary["output_tok_per_s"] > 0 and summary["req_per_s"] > 0
    assert summary["goodput_req_per_s"] == pytest.approx(summary["req_per_s"])  # a 10 s TTFT limit: all meet it
    assert summary["itl_ms"]["count"] == 6 * 4  # five tokens, four gaps each
    assert summary["ttft_ms"]["p50"] > 0 and summary["tpot_ms"]["p50"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    measured = [b for b in stub.bodies if images_in(b) == 1]
    assert len(measured) == 6 + 1  # and one warm-up
    assert all(b["max_tokens"] == 5 and b["ignore_eos"] is True and b["temperature"] == 0 for b in measured)
    assert all(b["stream_options"] == {"include_usage": True} and b["model"] == MODEL for b in measured)
    assert any(images_in(b) == 0 for b in stub.bodies)  # the text background ran beside them


def test_open_loop_through_the_python_api(stub):
    config = LoadConfig(url=stub.url, workload=WorkloadSpec("text"), requests=8, rate=200.0, output_len=3,
                        warmup=0, quiet=True)
    result = run_load(config)
    assert [r.index for r in result.results] == list(range(8))
    assert all(r.ok and r.output_tokens == 3 for r in result.results)
    assert result.summary().output_tokens == 24 and result.wall_s > 0


def test_bench_run_reports_failures_when_the_server_refuses(stub, capsys):
    code = cli.main(["bench", "run", "--url", stub.url, "--model", "no-such-model", "--workload", "text",
                     "--requests", "2", "--output-len", "2", "--warmup", "0", "--quiet", "--json"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 1
    assert report["summary"]["failures"] == 2
    assert report["summary"]["errors"] == {"HTTP 404: no model no-such-model": 2}


def test_compare_hf_against_a_server(stub, tmp_path, capsys):
    model_dir = make_tiny_model("kimi_k25", "tiny", tmp_path / "kimi", seed=7)
    code = cli.main(["bench", "compare", "--model", str(model_dir), "--workload", "image-1", "--requests", "2",
                     "--output-len", "4", "--runs", "1", "--skip", "colocated,cluster", "--against", stub.url,
                     "--json", "--quiet"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    label = stub.url.removeprefix("http://")
    table = "\n".join(out[:-1])
    assert table.splitlines()[1].split() == ["hf", label]
    ratio_row = next(line for line in table.splitlines() if line.startswith("tok/s ÷ hf"))
    assert ratio_row.split()[-2] == "1.00"
    report = json.loads(out[-1])
    hf, server = report["columns"]
    assert (hf["label"], server["label"]) == ("hf", label)
    assert hf["median"]["output_tokens"] == 8 == server["median"]["output_tokens"]  # no end token: ignore_eos
    assert hf["median"]["failures"] == 0 and hf["median"]["ttft_p50_ms"] > 0
    assert report["ratios"]["output_tok_per_s / hf"]["hf"] == 1.0
    assert report["ratios"]["output_tok_per_s / colocated"] is None
    # The stub's canned words are not what the model generates; it sends no token ids: text compared.
    same = report["same_output_as_hf"][label]
    assert (same["equal"], same["compared"], same["by_text"]) == (0, 2, 2)
    assert next(line for line in table.splitlines() if line.startswith("same output as hf")).endswith("0/2 text")


def test_compare_checks_both_modes_greedy_output_against_transformers(tmp_path, capsys):
    # The project's first promise, measured where users measure us: every request's token ids from
    # `epd serve`, colocated and disaggregated (streamed through the gateway), equal `generate`'s.
    model_dir = make_tiny_model("qwen3_vl_moe", "tiny", tmp_path / "qwen", seed=3)
    code = cli.main(["bench", "compare", "--model", str(model_dir), "--workload", "image-1", "--requests", "3",
                     "--concurrency", "3", "--output-len", "8", "--runs", "1", "--json", "--quiet"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    report = json.loads(out[-1])
    every_one = {"equal": 3, "compared": 3, "by_text": 0, "first_difference": None}
    assert report["same_output_as_hf"] == {"colocated": every_one, "cluster": every_one}
    # Where each started server's CPU went, by role, from its process tree (epd.bench.process_cpu).
    cpu = {c["label"]: c["cpu_s_per_request"] for c in report["columns"]}
    assert cpu["hf"] is None
    assert {"serve", "router", "colocated"} == set(cpu["colocated"]) and cpu["colocated"]["colocated"] > 0
    assert {"serve", "router", "encoder", "prefill", "decode"} == set(cpu["cluster"])
    assert sum(cpu["cluster"].values()) > 0


def test_ceiling_measures_hf_and_the_front_end_on_a_real_checkpoint(tmp_path, capsys):
    model_dir = make_tiny_model("kimi_k25", "tiny", tmp_path / "kimi", seed=7)
    code = cli.main(["bench", "ceiling", "--model", str(model_dir), "--requests", "2", "--output-len", "4",
                     "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    report = json.loads(out[-1])
    assert len(report["front_end_cpu_s"]) == 2 and all(s > 0 for s in report["front_end_cpu_s"])
    assert report["hf_wall_s"] > 0 and report["decode_floor_s"] > 0
    # The ceiling is hf's time over the fastest possible time, and decoding for free only raises it.
    assert report["max_ratio"] == report["hf_wall_s"] / report["min_wall_s"]
    assert report["max_ratio_free_decode"] > report["max_ratio"]
    # The engine's own batch-2 step, timed, prices the last 3 tokens after the front end.
    assert report["tail_step_s"] > 0
    assert report["engine_wall_s"] == report["front_end_wall_s"] + 3 * report["tail_step_s"]
    assert "cluster / hf at most" in out[-3] and "with this engine's decode step" in out[-2]


@pytest.mark.parametrize("kernels", ["native", "torch"])
@pytest.mark.parametrize("family", ["kimi_k25", "qwen3_vl_moe"])
def test_decode_profile_names_the_parts_of_a_real_step(family, kernels, tmp_path, capsys):
    model_dir = make_tiny_model(family, "tiny", tmp_path / family, seed=7)
    code = cli.main(["bench", "decode", "--model", str(model_dir), "--batch", "3", "--context", "20", "--steps", "3",
                     "--profile", "--kernels", kernels])
    out = capsys.readouterr().out
    assert code == 0
    parts = out.split("by part, summed over layers")[1].split("one step by operator:")[0].splitlines()[1:]
    rows = {m[1]: float(m[2]) for m in (re.match(r"\s+(.+?)\s+([\d.]+) ms", line) for line in parts) if m}
    # The two parts every MoE decode step has, and the step's own work around the model.
    assert rows["layer.self_attn"] > 0 and rows["layer.mlp.experts"] > 0
    if kernels == "torch":
        assert rows["layer.self_attn.(KV cache: write, gather)"] > 0  # the cache's update, timed apart
        assert "layer.self_attn.(decode attention, in place)" not in rows
    else:  # the kernel, timed apart (the cache's update then only writes: too small to be sure of a line)
        assert rows["layer.self_attn.(decode attention, in place)"] > 0
    assert rows["outside the model (packing, sampling, scheduling)"] > 0
    assert "aten::" in out.split("one step by operator:")[1]
    # float32 with the native kernels decodes through the direct forward; its parts are timed through the modules
    assert ("(direct forward)" in out) is (kernels == "native")


def test_hf_keeps_an_end_token_it_picks_and_goes_on_as_ignore_eos_does(tmp_path):
    # The checkpoint's end-of-sequence token is made the very token greedy decoding picks first:
    # a server with ignore_eos sends it and goes on, so the baseline must too (min_new_tokens would
    # mask it and pick another, and every server would then "differ" from hf there).
    from epd.bench.hf_baseline import HfBaseline
    from epd.bench.workloads import make_request

    model_dir = make_tiny_model("qwen3_vl_moe", "tiny", tmp_path / "qwen", seed=3)
    request = make_request(WorkloadSpec("image-1"), 0)
    first = HfBaseline(str(model_dir)).generate_one(request, 4).output_ids[0]
    config_path = model_dir / "generation_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "eos_token_id": first}))
    result = HfBaseline(str(model_dir)).generate_one(request, 4)
    assert result.ok and result.output_tokens == 4 and result.output_ids[0] == first
