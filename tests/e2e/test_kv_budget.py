"""A decode worker whose KV pool is full refuses new work with RESOURCE_EXHAUSTED, which the client sees
as 429 (streaming too: the first token waits for decode's admission); a request that could never fit
is a 400; and the blocks come back once the requests end."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from tests.e2e.cluster import start_cluster


def _body(max_tokens: int, stream: bool = False) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens, "ignore_eos": True,
            "temperature": 0, "stream": stream}


def _metric(url: str, name: str, labels: str) -> float:
    for line in httpx.get(url).text.splitlines():
        if line.startswith(f"{name}{{{labels}}}"):
            return float(line.split()[-1])
    raise AssertionError(f"{name}{{{labels}}} not exposed")


@pytest.fixture(scope="module")
def small_pool(e2e_dirs):
    # 11 usable blocks of 16 tokens: one request of ~16 + 150 tokens takes 11 on the decode worker.
    cluster = start_cluster(e2e_dirs["kimi_k25"], "--kv-blocks", "12")
    yield cluster
    assert cluster.stop() == 0


def test_a_request_larger_than_the_whole_pool_is_a_400(small_pool):
    reply = httpx.post(f"{small_pool.base_url}/chat/completions", json=_body(400), timeout=60)
    assert reply.status_code == 400
    assert "KV blocks" in reply.json()["error"]["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_full_pool_answers_429_and_the_other_request_completes(small_pool, stream):
    def send(_):
        with httpx.stream("POST", f"{small_pool.base_url}/chat/completions", json=_body(150, stream),
                          timeout=120) as reply:
            return reply.status_code, reply.read().decode()

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(send, range(3)))
    codes = sorted(code for code, _ in results)
    assert codes[0] == 200 and 429 in codes, results
    refused = next(body for code, body in results if code == 429)
    assert "KV blocks" in refused and "resource_exhausted" in refused
    workers = httpx.get(f"{small_pool.url}/workers").json()["workers"]
    for w in workers:
        if w["role"] in ("prefill", "decode"):
            assert _metric(w["metrics_url"], "epd_kv_blocks_used", f'role="{w["role"]}"') == 0
            assert _metric(w["metrics_url"], "epd_kv_blocks_total", f'role="{w["role"]}"') == 11
        if w["role"] == "prefill":
            assert _metric(w["metrics_url"], "epd_leases_active", 'kind="kv"') == 0
