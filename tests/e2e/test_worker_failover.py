"""A dead worker leaves routing within seconds and comes back when it is healthy again; the
cluster keeps answering correctly through the workers that are left."""

from __future__ import annotations

import signal

import httpx

from tests.e2e.cluster import free_port, until, wait_for_ready_file, worker_states
from tests.e2e.conftest import reference


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
    until(lambda: httpx.get(f"{url}/ready").status_code == 200, 30, "router never ready")
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
    ejected_after = until(lambda: worker_states(url)[dead] != "ready", 10, "killed worker still routed after 10 s")
    assert [answer() for _ in range(4)] == [expected] * 4  # all through decode-b
    assert worker_states(url)[infos["decode-b"]["address"]] == "ready"
    processes.procs["decode-a"].wait(10)
    wait_for_ready_file(processes.start("decode-a", "decode", "--model", model, "--port", str(ports["decode-a"])),
              list(processes.procs.values()))
    back_after = until(lambda: worker_states(url)[dead] == "ready", 15, "restarted worker not re-admitted")
    assert answer() == expected
    print(f"ejected after {ejected_after:.1f} s, re-admitted {back_after:.1f} s after its restart was ready")
