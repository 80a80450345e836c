"""epd.tls: which flags turn mutual TLS on, and a real handshake on loopback with a test CA."""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from epd import tls
from tests.certs import TestCA


def _args(ca=None, cert=None, key=None) -> argparse.Namespace:
    return argparse.Namespace(tls_ca=ca, tls_cert=cert, tls_key=key)


def test_off_without_flags():
    assert tls.from_args(_args()) is None


def test_a_certificate_without_a_ca_is_an_error_for_workers_and_https_for_the_router():
    with pytest.raises(ValueError, match="need --tls-ca"):
        tls.from_args(_args(cert="c.pem", key="k.pem"))
    assert tls.from_args(_args(cert="c.pem", key="k.pem"), cert_alone_ok=True) is None


def test_a_ca_needs_a_certificate_and_key():
    with pytest.raises(ValueError, match="all of"):
        tls.from_args(_args(ca="ca.pem"))


def test_unreadable_and_non_pem_files(tmp_path):
    (tmp_path / "junk.pem").write_text("junk")
    with pytest.raises(ValueError, match="--tls-ca /nonexistent.pem"):
        tls.from_args(_args("/nonexistent.pem", "c", "k"))
    with pytest.raises(ValueError, match="not a PEM file"):
        tls.from_args(_args(str(tmp_path / "junk.pem"), "c", "k"))


@pytest.fixture
def mutual(tmp_path):
    ca = TestCA(tmp_path)
    leaf = ca.leaf("peer")
    yield tls.from_args(_args(str(ca.path), str(leaf.cert), str(leaf.key)))
    tls.configure(None)


def test_configured_server_and_channel_shake_hands_and_plaintext_is_refused(mutual):
    tls.configure(mutual)
    server = grpc.server(ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = tls.add_port(server, "127.0.0.1:0")
    server.start()
    try:
        with tls.channel(f"127.0.0.1:{port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with grpc.insecure_channel(f"127.0.0.1:{port}") as plain, pytest.raises(grpc.RpcError):
            health_pb2_grpc.HealthStub(plain).Check(health_pb2.HealthCheckRequest(), timeout=5)
    finally:
        server.stop(0)
