"""The router finds decode workers through DNS: a name's address set grows and the new worker takes
traffic; it shrinks and the worker that left is drained while requests keep their answers.

The names live on a DNS server the test runs on loopback, and the router resolves them with the
resolver it always uses (`--dns-server` points it there); the two decode workers listen on the same
port at 127.0.0.1 and 127.0.0.2 (both loopback), as pods behind a headless Service do."""

from __future__ import annotations

import httpx
import pytest

from tests.dns_server import LoopbackDns
from tests.e2e.cluster import free_port, until, wait_for_ready_file, worker_states
from tests.e2e.conftest import reference

NAME = "epd-decode.cluster.test"


@pytest.fixture
def dns_server():
    server = LoopbackDns()
    yield server
    server.close()


def test_decode_workers_join_and_leave_through_dns(e2e_dirs, processes, dns_server):
    model = e2e_dirs["qwen3_vl_moe"]
    port = free_port()
    files = {"encoder": processes.start("encoder", "encoder", "--model", model),
             "prefill": processes.start("prefill", "prefill", "--model", model),
             "decode-1": processes.start("decode-1", "decode", "--model", model, "--host", "127.0.0.1",
                                         "--port", str(port)),
             "decode-2": processes.start("decode-2", "decode", "--model", model, "--host", "127.0.0.2",
                                         "--port", str(port))}
    infos = {name: wait_for_ready_file(path, list(processes.procs.values())) for name, path in files.items()}
    dns_server.set(NAME, ["127.0.0.1"])
    router = processes.start("router", "router", "--model", model, "--port", "0",
                             "--encoder", infos["encoder"]["address"], "--prefill", infos["prefill"]["address"],
                             "--discover-dns", f"decode={NAME}:{port}", "--dns-server", dns_server.address,
                             "--discover-interval-s", "0.5")
    url = f"http://127.0.0.1:{wait_for_ready_file(router, list(processes.procs.values()))['http_port']}"
    until(lambda: httpx.get(f"{url}/ready").status_code == 200, 30, "router never ready")
    first, second = f"127.0.0.1:{port}", f"127.0.0.2:{port}"
    decodes = lambda: {a: s for a, s in worker_states(url).items() if a.endswith(f":{port}")}  # noqa: E731
    assert decodes() == {first: "ready"}

    expected = reference(model, (), 8, "Say something.")[0]
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Say something."}]}],
            "max_tokens": 8, "temperature": 0, "return_token_ids": True}

    def answer() -> list[int]:
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["token_ids"]

    dns_server.set(NAME, ["127.0.0.1", "127.0.0.2"])
    until(lambda: decodes() == {first: "ready", second: "ready"}, 15, f"{second} never joined: {decodes()}")
    assert [answer() for _ in range(4)] == [expected] * 4
    served = httpx.get(f"http://127.0.0.2:{infos['decode-2']['metrics_port']}/metrics").text
    assert 'epd_requests_total{role="decode",status="ok"}' in served, "the new worker took no request"

    dns_server.set(NAME, ["127.0.0.2"])
    until(lambda: first not in decodes(), 15, f"{first} still routed after leaving DNS: {decodes()}")
    assert [answer() for _ in range(3)] == [expected] * 3
    assert decodes() == {second: "ready"}
