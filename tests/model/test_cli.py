"""The `epd` command line, run as a user runs it: a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from transformers import AutoModelForImageTextToText, AutoProcessor

from tests.model.conftest import reference_generate, sample_images, user_message


def run_epd(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "epd.cli", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})})


def test_make_tiny_model_writes_a_loadable_checkpoint(tmp_path):
    out = tmp_path / "qwen"
    proc = run_epd("make-tiny-model", "--family", "qwen3_vl_moe", "--size", "tiny", "--out", str(out), "--seed", "5")
    assert proc.returncode == 0, proc.stderr
    assert AutoProcessor.from_pretrained(out).image_processor is not None
    model = AutoModelForImageTextToText.from_pretrained(out)
    assert 0 < sum(p.numel() for p in model.parameters()) < 2_000_000


def test_generate_json_equals_transformers(tiny_dirs, tmp_path):
    image_path = tmp_path / "gradient.png"
    sample_images()[0].save(image_path)
    proc = run_epd("generate", "--model", tiny_dirs["kimi_k25"], "--image", str(image_path),
                   "--prompt", "What is shown?", "--max-tokens", "33", "--json")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    answer = json.loads(lines[0])
    from PIL import Image

    image = Image.open(image_path).convert("RGB")
    expected, prompt_len = reference_generate(
        tiny_dirs["kimi_k25"], [user_message(1, "What is shown?", with_pixels=[image])], 33)
    assert answer["token_ids"] == expected
    assert answer["prompt_tokens"] == prompt_len
    assert isinstance(answer["text"], str) and answer["text"]


def test_generate_on_checkpoint_without_processor_exits_with_the_file_named(tiny_dirs, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_dirs["qwen3_vl_moe"], broken)
    (broken / "processor_config.json").unlink()
    proc = run_epd("generate", "--model", str(broken), "--prompt", "hi")
    assert proc.returncode != 0
    assert str(broken) in proc.stderr and "preprocessor_config.json" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_generate_rejects_a_missing_image_file(tiny_dirs, tmp_path):
    proc = run_epd("generate", "--model", tiny_dirs["kimi_k25"], "--image", str(tmp_path / "nope.png"),
                   "--prompt", "hi")
    assert proc.returncode == 2
    assert "image file not found" in proc.stderr


def test_generate_without_model_uses_a_fresh_demo_cache(tmp_path):
    """`epd generate` without --model: the demo checkpoint is generated, cached, reused."""
    args = ("generate", "--image", "deploy/demo/house.png", "--prompt", "What is in this picture?", "--json")
    env = {"EPD_CACHE_DIR": str(tmp_path / "cache")}
    first = run_epd(*args, env=env)
    assert first.returncode == 0, first.stderr
    cached = list((tmp_path / "cache" / "models").iterdir())
    assert [p.name for p in cached] == ["kimi_k25-tiny-seed0"]
    second = run_epd(*args, env=env)
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["token_ids"] == json.loads(first.stdout)["token_ids"]
    assert len(json.loads(first.stdout)["token_ids"]) == 32


def test_bench_decode_reports_a_fraction_of_the_bandwidth_bound(tiny_dirs):
    import json
    import subprocess
    import sys
    from pathlib import Path

    epd = [sys.executable, str(Path(sys.executable).parent / "epd")]
    out = subprocess.run([*epd, "bench", "decode", "--model", tiny_dirs["kimi_k25"], "--batch", "4", "--context", "8",
                          "--steps", "3", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    assert figures["batch"] == 4 and figures["tokens_per_s"] > 0 and figures["read_gb_per_s"] > 0.5
    assert figures["fraction_of_bound"] > 0 and figures["weight_bytes_per_step"] > 0
    assert "measured / bound" in out.stdout
