"""The gateway with an API key (EPD_API_KEY) and with TLS, driven by the official openai client.

One Kimi-K2.5 `epd serve` for the module, started with EPD_PORT and EPD_METRICS_PORT in its
environment (which used to give every child the same port); a second router, started on the same
workers with `--tls-cert/--tls-key`, serves HTTPS that the client trusts through the test CA.
"""

from __future__ import annotations

import ssl

import grpc
import httpx
import openai
import pytest

from epd.v1 import common_pb2, router_pb2, router_pb2_grpc
from tests.certs import TestCA
from tests.e2e.cluster import free_port, wait_for_ready_file
from tests.e2e.cluster import start_cluster as start
from tests.e2e.conftest import data_url, openai_messages, pattern_image, reference

KEY = "sk-epd-test-5b0c1d"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def cluster(e2e_dirs):
    env = {"EPD_API_KEY": KEY, "EPD_PORT": str(free_port()), "EPD_METRICS_PORT": str(free_port())}
    running = start(e2e_dirs["kimi_k25"], env=env)
    yield running
    assert running.stop() == 0


def _ask(client: openai.OpenAI, model_dir: str) -> None:
    expected_ids, expected_text = reference(model_dir, (2,), 6)
    reply = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=6, temperature=0,
                                           messages=openai_messages([data_url(pattern_image(2))]),
                                           extra_body={"return_token_ids": True})
    assert reply.choices[0].model_extra["token_ids"] == expected_ids
    assert reply.choices[0].message.content == expected_text


def test_the_right_key_gets_answers(cluster, e2e_dirs):
    _ask(openai.OpenAI(base_url=cluster.base_url, api_key=KEY, max_retries=0, timeout=120), e2e_dirs["kimi_k25"])


@pytest.mark.parametrize("key", ["wrong", KEY + "x", ""])
def test_a_wrong_key_gets_401(cluster, key):
    client = openai.OpenAI(base_url=cluster.base_url, api_key=key or "unused", max_retries=0, timeout=30)
    with pytest.raises(openai.AuthenticationError) as caught:
        client.chat.completions.create(model="x", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 401
    assert caught.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        client.models.list()


def test_no_key_gets_401_but_probes_and_metrics_stay_open(cluster):
    with httpx.Client(base_url=cluster.url, timeout=30) as http:
        for path in ("/v1/models", "/workers"):
            reply = http.get(path)
            assert reply.status_code == 401, path
            assert reply.json()["error"]["code"] == "invalid_api_key"
        assert http.post("/v1/chat/completions", json={"messages": []}).status_code == 401
        assert http.get("/health").status_code == 200
        assert http.get("/ready").status_code == 200
        assert "epd_" in http.get("/metrics").text
        assert http.get("/workers", headers=AUTH).status_code == 200


def test_epd_port_in_the_environment_did_not_reach_the_children(cluster):
    """Every child got a port of its own: the cluster is up with three distinct worker addresses."""
    with httpx.Client(base_url=cluster.url, timeout=30) as http:
        workers = http.get("/workers", headers=AUTH).json()["workers"]
    assert len({w["address"] for w in workers}) == 3
    assert len({w["metrics_url"] for w in workers}) == 3


def test_grpc_router_needs_the_key_too(cluster):
    ok = router_pb2.GenerateRequest(request_id="k", sampling=common_pb2.SamplingParams(max_tokens=2), messages=[
        router_pb2.ChatMessage(role=router_pb2.ROLE_USER, content=[router_pb2.ContentPart(text="hi")])])
    with grpc.insecure_channel(cluster.grpc_address) as channel:
        stub = router_pb2_grpc.RouterStub(channel)
        for metadata in ((), (("authorization", "Bearer wrong"),)):
            with pytest.raises(grpc.RpcError) as caught:
                list(stub.Generate(ok, timeout=30, metadata=metadata))
            assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        events = list(stub.Generate(ok, timeout=60, metadata=(("authorization", f"Bearer {KEY}"),)))
    assert events[-1].WhichOneof("event") == "complete"


@pytest.fixture(scope="module")
def tls_router(cluster, e2e_dirs, tmp_path_factory):
    """A second router on the same workers, serving HTTPS with a certificate from a test CA."""
    tmp = tmp_path_factory.mktemp("tls")
    ca = TestCA(tmp)
    server = ca.leaf("router")
    with httpx.Client(base_url=cluster.url, timeout=30) as http:
        workers = http.get("/workers", headers=AUTH).json()["workers"]
    args = ["router", "--model", e2e_dirs["kimi_k25"], "--port", "0", "--api-key", KEY,
            "--tls-cert", str(server.cert), "--tls-key", str(server.key)]
    for w in workers:
        args += [f"--{w['role']}", f"{w['address']},metrics={w['metrics_url']}"]
    from tests.e2e.cluster import Processes

    procs = Processes(tmp)
    ready = procs.start("router", *args)
    info = wait_for_ready_file(ready, list(procs.procs.values()))
    yield f"https://127.0.0.1:{info['http_port']}", ca, f"127.0.0.1:{info['grpc_port']}"
    procs.stop_all()


def test_tls_with_the_test_ca(tls_router, e2e_dirs):
    url, ca, _ = tls_router
    with httpx.Client(verify=ssl.create_default_context(cafile=str(ca.path)), timeout=120) as http:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, http_client=http)
        _ask(client, e2e_dirs["kimi_k25"])
        assert http.get(f"{url}/health").status_code == 200


def test_tls_refuses_a_client_that_does_not_trust_the_ca(tls_router):
    url, _, _ = tls_router
    with httpx.Client(timeout=30) as http:  # the system's CAs only
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, http_client=http)
        with pytest.raises(openai.APIConnectionError):
            client.models.list()
    with pytest.raises(httpx.HTTPError):  # plain HTTP to the TLS port is not served
        httpx.get(url.replace("https://", "http://") + "/health", timeout=10)


def test_the_grpc_router_api_serves_tls_too(tls_router):
    _, ca, address = tls_router
    ok = router_pb2.GenerateRequest(request_id="t", sampling=common_pb2.SamplingParams(max_tokens=2), messages=[
        router_pb2.ChatMessage(role=router_pb2.ROLE_USER, content=[router_pb2.ContentPart(text="hi")])])
    key = (("authorization", f"Bearer {KEY}"),)
    trusted = grpc.ssl_channel_credentials(root_certificates=ca.path.read_bytes())
    with grpc.secure_channel(address, trusted) as channel:
        events = list(router_pb2_grpc.RouterStub(channel).Generate(ok, timeout=60, metadata=key))
    assert events[-1].WhichOneof("event") == "complete"
    with grpc.insecure_channel(address) as plain, pytest.raises(grpc.RpcError) as caught:
        list(router_pb2_grpc.RouterStub(plain).Generate(ok, timeout=10, metadata=key))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
