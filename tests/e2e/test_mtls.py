"""Mutual TLS between router and workers (and between workers for pulls), certificates from a test CA.

The cluster answers over HTTPS exactly as transformers does, with every gRPC hop authenticated; a
caller without a certificate from the CA gets nothing from any worker.
"""

from __future__ import annotations

import ssl

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.certs import TestCA
from tests.e2e.cluster import until, wait_for_ready_file
from tests.e2e.conftest import data_url, openai_messages, pattern_image, reference


def _health(channel: grpc.Channel) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10).status


def test_mutual_tls_cluster(e2e_dirs, processes, tmp_path):
    model = e2e_dirs["kimi_k25"]
    ca = TestCA(tmp_path)
    leaves = {name: ca.leaf(name) for name in ("encoder", "prefill", "decode", "router", "stranger")}

    def tls_flags(name: str) -> list[str]:
        return ["--tls-ca", str(ca.path), "--tls-cert", str(leaves[name].cert), "--tls-key", str(leaves[name].key)]

    files = {role: processes.start(role, role, "--model", model, *tls_flags(role))
             for role in ("encoder", "prefill", "decode")}
    infos = {role: wait_for_ready_file(path, list(processes.procs.values())) for role, path in files.items()}
    ready = processes.start("router", "router", "--model", model, "--port", "0", *tls_flags("router"),
                            *[arg for role, info in infos.items() for arg in (f"--{role}", info["address"])])
    url = f"https://127.0.0.1:{wait_for_ready_file(ready, list(processes.procs.values()))['http_port']}"
    trust = ssl.create_default_context(cafile=str(ca.path))
    with httpx.Client(base_url=url, verify=trust, timeout=120) as http:
        until(lambda: http.get("/ready").status_code == 200, 60, "router never ready over mutual TLS")
        expected_ids, expected_text = reference(model, (4,), 8)
        reply = http.post("/v1/chat/completions", json={
            "messages": openai_messages([data_url(pattern_image(4))]), "max_tokens": 8, "temperature": 0,
            "return_token_ids": True})
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["token_ids"] == expected_ids
        assert reply.json()["choices"][0]["message"]["content"] == expected_text

    encoder = infos["encoder"]["address"]
    with grpc.insecure_channel(encoder) as plain, pytest.raises(grpc.RpcError) as caught:
        _health(plain)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    no_cert = grpc.ssl_channel_credentials(root_certificates=ca.path.read_bytes())
    with grpc.secure_channel(encoder, no_cert) as anonymous, pytest.raises(grpc.RpcError):
        _health(anonymous)
    (tmp_path / "other").mkdir()
    outsider = TestCA(tmp_path / "other").leaf("outsider")  # a certificate, but from another CA
    foreign = grpc.ssl_channel_credentials(root_certificates=ca.path.read_bytes(),
                                           private_key=outsider.key.read_bytes(),
                                           certificate_chain=outsider.cert.read_bytes())
    with grpc.secure_channel(encoder, foreign) as impostor, pytest.raises(grpc.RpcError):
        _health(impostor)
    member = grpc.ssl_channel_credentials(root_certificates=ca.path.read_bytes(),
                                          private_key=leaves["stranger"].key.read_bytes(),
                                          certificate_chain=leaves["stranger"].cert.read_bytes())
    with grpc.secure_channel(encoder, member) as channel:
        assert _health(channel) == health_pb2.HealthCheckResponse.SERVING
