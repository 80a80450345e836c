"""The seed failure: an encoder without its image processor never starts, and no cluster with
such an encoder ever reports ready."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import httpx
import pytest

from tests.e2e.cluster import EPD, free_port, wait_for_ready_file
from tests.e2e.conftest import data_url, pattern_image


@pytest.fixture(scope="module")
def no_processor_dir(e2e_dirs, tmp_path_factory) -> str:
    """The Kimi checkpoint minus its image processor config (processor_config.json keeps the rest)."""
    out = tmp_path_factory.mktemp("no_processor") / "kimi_no_processor"
    shutil.copytree(e2e_dirs["kimi_k25"], out)
    config = json.loads((out / "processor_config.json").read_text())
    del config["image_processor"]
    (out / "processor_config.json").write_text(json.dumps(config))
    (out / "preprocessor_config.json").unlink(missing_ok=True)
    return str(out)


def test_encoder_without_processor_exits_naming_the_file(no_processor_dir):
    started = time.monotonic()
    done = subprocess.run([*EPD, "encoder", "--model", no_processor_dir, "--port", "0"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1
    assert no_processor_dir in done.stderr and "preprocessor_config.json" in done.stderr
    assert "Traceback" not in done.stderr
    assert time.monotonic() - started < 60


def test_serve_with_such_an_encoder_fails_and_never_reports_ready(no_processor_dir):
    done = subprocess.run([*EPD, "serve", "--model", no_processor_dir, "--port", "0"], capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 1
    assert "EPD cluster ready" not in done.stdout
    assert "preprocessor_config.json" in done.stderr and "encoder-0 exited with code 1" in done.stderr


def test_router_never_ready_without_a_ready_encoder(e2e_dirs, tmp_path):
    """Real prefill and decode workers, and an encoder address where the refused encoder would have been."""
    model = e2e_dirs["kimi_k25"]
    procs, infos = [], []
    try:
        for role in ("prefill", "decode"):
            ready = tmp_path / f"{role}.json"
            procs.append(subprocess.Popen([*EPD, role, "--model", model, "--ready-file", str(ready)]))
            infos.append(ready)
        addresses = [wait_for_ready_file(p, procs)["address"] for p in infos]
        router_ready = tmp_path / "router.json"
        procs.append(subprocess.Popen([*EPD, "router", "--model", model, "--port", "0", "--ready-file",
                                       str(router_ready), "--encoder", f"127.0.0.1:{free_port()}",
                                       "--prefill", addresses[0], "--decode", addresses[1]]))
        url = f"http://127.0.0.1:{wait_for_ready_file(router_ready, procs)['http_port']}"
        for _ in range(10):  # several health rounds: the state must not flip to ready
            ready = httpx.get(f"{url}/ready", timeout=10)
            assert ready.status_code == 503
            assert ready.json()["ready_workers"] == {"encoder": 0, "prefill": 1, "decode": 1}
            time.sleep(0.3)
        assert httpx.get(f"{url}/health").status_code == 200
        image = data_url(pattern_image(0))
        reply = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "hi"}]}]})
        assert reply.status_code == 503 and "encoder" in reply.json()["error"]["message"]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
