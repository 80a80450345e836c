"""The README's front door stays true: `epd serve` on the demo checkpoint, then its curl and openai
examples, run as written (only the port is changed), answer what the in-process path answers."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.cluster import start_cluster

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    cluster = start_cluster(None, env={"EPD_CACHE_DIR": str(cache)})
    yield cluster, cache
    assert cluster.stop() == 0


@pytest.fixture(scope="module")
def expected_text(demo) -> str:
    """The same request through the in-process path, on the checkpoint `epd serve` generated."""
    _, cache = demo
    [model_dir] = list((cache / "models").iterdir())
    done = subprocess.run([sys.executable, "-m", "epd", "generate", "--model", str(model_dir), "--image",
                           "deploy/demo/house.png", "--prompt", "What is in this picture?", "--max-tokens", "16",
                           "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300, check=True)
    text = json.loads(done.stdout)["text"]
    assert text.strip(), "an empty reference would make the comparisons below vacuous"
    return text


def test_first_command_starts_the_cluster_on_the_demo_model():
    first, second = _blocks("bash")[0].strip().splitlines()
    assert first == "./scripts/setup.sh && .venv/bin/epd serve"
    assert second == "./scripts/setup.sh && ./scripts/test.sh"


def test_readme_curl_example(demo, expected_text):
    cluster, _ = demo
    [curl] = [b for b in _blocks("bash") if b.startswith("curl")]
    command = curl.replace("http://127.0.0.1:8000", cluster.url)
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert reply["choices"][0]["message"]["content"] == expected_text
    assert reply["usage"]["completion_tokens"] == 16


def test_readme_openai_example(demo, expected_text):
    cluster, _ = demo
    [example] = _blocks("python")
    code = example.replace("http://127.0.0.1:8000", cluster.url)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected_text + "\n"
