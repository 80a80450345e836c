"""A dead worker leaves routing within seconds and comes back when it is healthy again; the
cluster keeps answering correctly through the workers that are left."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.cluster import EPD, free_port, wait_for_ready_file
from tests.e2e.conftest import reference


def _states(url: str) -> dict[str, str]:
    return {w["address"]: w["state"] for w in httpx.get(f"{url}/workers", timeout=10).json()["workers"]}


def _until(check, timeout_s: float, what: str) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, what
        time.sleep(0.2)
    return time.monotonic() - started


class Processes:
    def __init__(self, tmp: Path) -> None:
        self.tmp, self.procs = tmp, {}

    def start(self, name: str, *args: str) -> dict:
        ready = self.tmp / f"{name}.json"
        ready.unlink(missing_ok=True)
        self.procs[name] = subprocess.Popen([*EPD, *args, "--ready-file", str(ready)])
        return ready

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            p.wait(30)


@pytest.fixture
def processes(tmp_path):
    procs = Processes(tmp_path)
    yield procs
    procs.stop_all()


def test_dead_decode_worker_is_ejected_and_readmitted(e2e_dirs, processes):
    model = e2e_dirs["kimi_k25"]
    ports = {"decode-a": free_port(), "decode-b": free_port()}
    files = {name: processes.start(name, role, "--model", model, *(["--port", str(ports[name])] if name in ports
                                                                     else []))
             for name, role in (("encoder", "encoder"), ("prefill", "prefill"), ("decode-a", "decode"),
                                ("decode-b", "decode"))}
    infos = {name: wait_for_ready_file(path, list(processes.procs.values())) for name, path in files.items()}
    router = processes.start("router", "router", "--model", model, "--port", "0",
                             "--encoder", infos["encoder"]["address"], "--prefill", infos["prefill"]["address"],
                             "--decode", infos["decode-a"]["address"], "--decode", infos["decode-b"]["address"])
    url = f"http://127.0.0.1:{wait_for_ready_file(router, list(processes.procs.values()))['http_port']}"
    _until(lambda: httpx.get(f"{url}/ready").status_code == 200, 30, "router never ready")
    expected = reference(model, (), 8, "Say something.")[0]
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Say something."}]}],
            "max_tokens": 8, "temperature": 0, "return_token_ids": True}

    def answer() -> list[int]:
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["token_ids"]

    assert [answer() for _ in range(2)] == [expected] * 2
    dead = infos["decode-a"]["address"]
    processes.procs["decode-a"].send_signal(signal.SIGKILL)
    ejected_after = _until(lambda: _states(url)[dead] != "ready", 10, "killed worker still routed after 10 s")
    assert [answer() for _ in range(4)] == [expected] * 4  # all through decode-b
    assert _states(url)[infos["decode-b"]["address"]] == "ready"
    processes.procs["decode-a"].wait(10)
    wait_for_ready_file(processes.start("decode-a", "decode", "--model", model, "--port", str(ports["decode-a"])),
              list(processes.procs.values()))
    back_after = _until(lambda: _states(url)[dead] == "ready", 15, "restarted worker not re-admitted")
    assert answer() == expected
    print(f"ejected after {ejected_after:.1f} s, re-admitted {back_after:.1f} s after its restart was ready")
