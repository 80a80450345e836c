"""Operating `epd serve`: endpoints, the embedding cache, bad requests, SIGTERM.

One Kimi-K2.5 cluster for the module; the last test stops it and checks that nothing is left.
"""

from __future__ import annotations

import re
import time
import urllib.request

import httpx
import openai
import pytest

from tests.e2e.cluster import alive, cmdline, start_cluster
from tests.e2e.conftest import data_url, openai_messages, pattern_image, reference


@pytest.fixture(scope="module")
def cluster(e2e_dirs):
    running = start_cluster(e2e_dirs["kimi_k25"], "--encoders", "2")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(cluster):
    return openai.OpenAI(base_url=cluster.base_url, api_key="unused", max_retries=0, timeout=120)


def _scrape(url: str, name: str, labels: str = "") -> float:
    """Sum of a metric's samples (matching a label fragment) in a Prometheus text exposition."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and labels in line and not line.startswith("#"))


def test_endpoints_describe_the_cluster(cluster):
    assert httpx.get(f"{cluster.url}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{cluster.url}/ready")
    assert ready.status_code == 200 and ready.json()["ready_workers"] == {"encoder": 2, "prefill": 1, "decode": 1}
    models = httpx.get(f"{cluster.base_url}/models").json()
    assert [m["id"] for m in models["data"]] == ["kimi_k25"]
    workers = httpx.get(f"{cluster.url}/workers").json()["workers"]
    assert sorted(w["role"] for w in workers) == ["decode", "encoder", "encoder", "prefill"]
    assert {w["state"] for w in workers} == {"ready"}
    for w in workers:  # every worker's own metrics endpoint answers with the shared names
        assert _scrape(w["metrics_url"], "epd_queue_depth", f'role="{w["role"]}"') >= 0
    assert "epd_ttft_seconds_bucket" in httpx.get(f"{cluster.url}/metrics").text


def test_same_image_twice_is_a_cache_hit_with_the_same_answer(cluster, client, e2e_dirs):
    encoders = [w["metrics_url"] for w in httpx.get(f"{cluster.url}/workers").json()["workers"]
                if w["role"] == "encoder"]
    hits_before = sum(_scrape(u, "epd_embedding_cache_hits_total", 'role="encoder"') for u in encoders)
    misses_before = sum(_scrape(u, "epd_embedding_cache_misses_total", 'role="encoder"') for u in encoders)
    messages = openai_messages([data_url(pattern_image(40))])
    answers = [client.chat.completions.create(model="kimi_k25", messages=messages, max_tokens=16, temperature=0,
                                              extra_body={"return_token_ids": True}) for _ in range(2)]
    hits = sum(_scrape(u, "epd_embedding_cache_hits_total", 'role="encoder"') for u in encoders) - hits_before
    misses = sum(_scrape(u, "epd_embedding_cache_misses_total", 'role="encoder"') for u in encoders) - misses_before
    assert (misses, hits) == (1, 1)  # affinity sent the repeat to the encoder that already held it
    ids = [a.choices[0].model_extra["token_ids"] for a in answers]
    assert ids[0] == ids[1] == reference(e2e_dirs["kimi_k25"], (40,), 16)[0]


BAD_BODIES = [
    ({}, 400, "messages"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}, 400, "temperature"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n"),
    ({"messages": [{"role": "user", "content": "hi"}], "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "ftp://x/y.png"}}]}]},
     400, None),
    ({"messages": [{"role": "user", "content": [{"type": "image_url",
                                                "image_url": {"url": "data:image/png;base64,aGVsbG8="}}]}]}, 400, None),
    ({"messages": [{"role": "user", "content": [{"type": "image_url",
                                                "image_url": {"url": "http://169.254.169.254/latest/x.png"}}]}]},
     400, None),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(
        pattern_image(1))}}] * 9}]}, 400, None),
    ({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
]


@pytest.mark.parametrize(("body", "status", "param"), BAD_BODIES)
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(cluster, client, body, status, param):
    reply = httpx.post(f"{cluster.base_url}/chat/completions", json=body, timeout=30)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["message"] and error["type"]
    if param is not None:
        assert error["param"] == param
    ok = client.chat.completions.create(model="kimi_k25", messages=[{"role": "user", "content": "hi"}],
                                        max_tokens=2, temperature=0)
    assert ok.choices[0].finish_reason in ("length", "stop")


def test_malformed_json_unknown_route_and_client_errors(cluster, client):
    reply = httpx.post(f"{cluster.base_url}/chat/completions", content=b"{not json", timeout=30,
                       headers={"content-type": "application/json"})
    assert reply.status_code == 400 and "JSON" in reply.json()["error"]["message"]
    missing = httpx.get(f"{cluster.base_url}/nope")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="kimi_k25", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=10_000_000)
    assert caught.value.status_code == 400 and "max_tokens" in str(caught.value)


def test_stop_string_ends_the_answer_early(cluster, client, e2e_dirs):
    _, text = reference(e2e_dirs["kimi_k25"], (41,), 16)
    stop = text[len(text) // 2:len(text) // 2 + 3]
    assert stop.strip(), f"reference text too short to pick a stop string from: {text!r}"
    reply = client.chat.completions.create(model="kimi_k25", messages=openai_messages([data_url(pattern_image(41))]),
                                           max_tokens=16, temperature=0, stop=[stop])
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == text[:text.index(stop)]


def test_client_disconnect_cancels_the_decode(cluster, client):
    with httpx.stream("POST", f"{cluster.base_url}/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000, "ignore_eos": True,
            "temperature": 0, "stream": True}) as stream:
        for i, _ in enumerate(stream.iter_lines()):
            if i > 6:
                break  # leaving the block closes the connection mid-stream
    decode = next(w for w in httpx.get(f"{cluster.url}/workers").json()["workers"] if w["role"] == "decode")
    deadline = time.monotonic() + 20
    while _scrape(decode["metrics_url"], "epd_running_requests", 'role="decode"') != 0:
        assert time.monotonic() < deadline, "decode still running 20 s after the client left"
        time.sleep(0.2)


def test_grpc_router_refuses_bad_input_with_invalid_argument(cluster):
    import grpc

    from epd.v1 import common_pb2, router_pb2, router_pb2_grpc

    bad = router_pb2.GenerateRequest(request_id="bad", messages=[router_pb2.ChatMessage(
        role=router_pb2.ROLE_USER, content=[router_pb2.ContentPart(image_bytes=b"not an image")])])
    with grpc.insecure_channel(cluster.grpc_address) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            list(router_pb2_grpc.RouterStub(channel).Generate(bad, timeout=60))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "image" in caught.value.details()
        ok = router_pb2.GenerateRequest(request_id="ok", sampling=common_pb2.SamplingParams(max_tokens=2),
                                        messages=[router_pb2.ChatMessage(role=router_pb2.ROLE_USER,
                                                                         content=[router_pb2.ContentPart(text="hi")])])
        events = list(router_pb2_grpc.RouterStub(channel).Generate(ok, timeout=60))
    assert events[-1].WhichOneof("event") == "complete"


def test_nothing_is_left_leased_after_the_requests(cluster):
    """Every embedding and KV handle issued above was acknowledged: none waits for its TTL."""
    workers = httpx.get(f"{cluster.url}/workers").json()["workers"]
    for w in workers:
        if w["role"] in ("encoder", "prefill"):
            kind = "embedding" if w["role"] == "encoder" else "kv"
            assert _scrape(w["metrics_url"], "epd_leases_active", f'kind="{kind}"') == 0, w
            assert _scrape(w["metrics_url"], "epd_reaped_total", f'kind="{kind}"') == 0, w
    served = {role: sum(_scrape(w["metrics_url"], "epd_requests_total", f'role="{role}",status="ok"')
                        for w in workers if w["role"] == role) for role in ("encoder", "prefill", "decode")}
    assert served["encoder"] >= 3 and served["prefill"] >= 10 and served["decode"] >= 10, served


def test_client_leaving_a_non_streaming_request_cancels_it_too(cluster):
    decode = next(w for w in httpx.get(f"{cluster.url}/workers").json()["workers"] if w["role"] == "decode")
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4000, "ignore_eos": True, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):  # 4000 tokens take far longer than the client waits
        httpx.post(f"{cluster.base_url}/chat/completions", json=body, timeout=1.5)
    left = time.monotonic()
    while _scrape(decode["metrics_url"], "epd_running_requests", 'role="decode"') != 0:
        assert time.monotonic() - left < 6, "decode still running 6 s after the client left"
        time.sleep(0.2)
    counted = _scrape(f"{cluster.url}/metrics", "epd_requests_total", 'status="cancelled"')
    assert counted >= 1


def test_sigterm_leaves_no_process_behind(cluster):
    children = cluster.worker_pids()
    assert len(children) == 5  # 2 encoders, prefill, decode, router
    roles = [re.search(r"\bepd (\w+) ", cmdline(p)) for p in children]
    assert sorted(m.group(1) for m in roles if m) == ["decode", "encoder", "encoder", "prefill", "router"]
    assert cluster.stop() == 0
    deadline = time.monotonic() + 10
    while any(alive(p) for p in children):
        assert time.monotonic() < deadline, [cmdline(p) for p in children if alive(p)]
        time.sleep(0.1)
