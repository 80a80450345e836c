"""`epd ray up` on a real local Ray cluster: answers equal transformers through the openai client, and
decode scales 1 → 2 → 1 with `epd ray scale` while requests flow, with no request failing, and a killed
decode worker is replaced."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import httpx
import pytest

from tests.e2e.cluster import EPD, cmdline, free_port, start_cluster, until, worker_states
from tests.e2e.conftest import data_url, openai_messages, pattern_image, reference

pytest.importorskip("ray")
RAY = str(Path(sys.executable).parent / "ray")


@pytest.fixture
def ray_head(monkeypatch):
    """A Ray head (its own temp dir), token authentication on for it and every process that joins
    (they inherit both variables); `ray stop` afterwards. The token is made here: `ray start` does
    not make one (Ray 2.60 refuses to start without it), and the user's ~/.ray stays untouched."""
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", secrets.token_hex(32))
    port = free_port()
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env_args = ["--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "8",
                "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", temp]
    subprocess.run([RAY, "start", *env_args], check=True, timeout=180, stdout=subprocess.DEVNULL)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([RAY, "stop", "--force"], timeout=120, stdout=subprocess.DEVNULL, check=False)
        shutil.rmtree(temp, ignore_errors=True)


def decode_workers(url: str) -> dict[str, dict]:
    """The router's decode workers: address -> its /workers entry."""
    workers = httpx.get(f"{url}/workers", timeout=10).json()["workers"]
    return {w["address"]: w for w in workers if w["role"] == "decode"}


def decode_processes(model: str) -> list[int]:
    """Pids of `epd decode` processes serving `model` (the workers the Ray actors run)."""
    return [int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and f" decode --model {model} " in cmdline(int(p.name))]


def ray_status(address: str) -> dict:
    done = subprocess.run([*EPD, "ray", "status", "--address", address], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_ray_up_answers_like_transformers_and_scales_decode_without_failures(e2e_dirs, ray_head):
    from openai import OpenAI

    model = e2e_dirs["kimi_k25"]
    cluster = start_cluster(model, "--address", ray_head, "--cpus-per-worker", "1", command=("ray", "up"))
    try:
        client = OpenAI(base_url=cluster.base_url, api_key="unused", max_retries=0, timeout=120)
        expected = reference(model, (3,), 8)[1]
        ask = lambda: client.chat.completions.create(  # noqa: E731
            model=client.models.list().data[0].id, max_tokens=8, temperature=0,
            messages=openai_messages([data_url(pattern_image(3))])).choices[0].message.content
        assert ask() == expected

        answers, failures, stop = [], [], threading.Event()

        def traffic() -> None:
            while not stop.is_set():
                try:
                    answers.append(ask())
                except Exception as exc:  # every failure is a finding: recorded, asserted empty below
                    failures.append(repr(exc))

        flows = [threading.Thread(target=traffic, daemon=True) for _ in range(2)]
        for flow in flows:
            flow.start()
        first = set(decode_workers(cluster.url))
        scaled = subprocess.run([*EPD, "ray", "scale", "decode", "2", "--address", ray_head],
                                capture_output=True, text=True, timeout=300)
        assert scaled.returncode == 0, scaled.stderr
        assert "decode now has 2 worker(s)" in scaled.stdout
        # scale returns once the new worker is routed to
        decodes = decode_workers(cluster.url)
        assert sorted(w["state"] for w in decodes.values()) == ["ready", "ready"], decodes
        (second,) = set(decodes) - first
        served_before = len(answers)
        until(lambda: len(answers) >= served_before + 6, 120, "requests stopped flowing after scaling up")
        metrics = httpx.get(decodes[second]["metrics_url"], timeout=10).text
        assert 'epd_requests_total{role="decode",status="ok"}' in metrics, "the new decode worker took no request"

        scaled = subprocess.run([*EPD, "ray", "scale", "decode", "1", "--address", ray_head],
                                capture_output=True, text=True, timeout=300)
        assert scaled.returncode == 0, scaled.stderr
        assert set(decode_workers(cluster.url)) == first, "the newest decode worker is the one drained"
        served_after = len(answers)
        until(lambda: len(answers) >= served_after + 4, 120, "requests stopped flowing after scaling down")
        stop.set()
        for flow in flows:
            flow.join(120)

        assert failures == []
        assert set(answers) == {expected}, "every answer equals transformers'"
        assert second not in worker_states(cluster.url)

        # The last decode worker's process is killed: the controller unlists it, starts another after
        # the restart policy's delay, and the cluster answers as before.
        until(lambda: len(decode_processes(model)) == 1, 60, "the drained decode worker's process is still there")
        (victim,) = decode_processes(model)
        os.kill(victim, signal.SIGKILL)
        until(lambda: ray_status(ray_head)["restarts"]["decode"] == 1 and decode_workers(cluster.url).keys() - first
              and all(w["state"] == "ready" for w in decode_workers(cluster.url).values()), 180,
              "the killed decode worker was not replaced")
        assert ray_status(ray_head)["gave_up"] == {}
        assert ask() == expected
    finally:
        code = cluster.stop(120)
    assert code == 0, "".join(cluster.output)
