"""The gateway's API key check and TLS flags, on a small ASGI app (no model)."""

from __future__ import annotations

import argparse

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from router.security import (
    ApiKeyMiddleware,
    add_security_arguments,
    check_security_arguments,
    grpc_key_matches,
    key_matches,
)

KEY = "sk-test-0123456789"


@pytest.mark.parametrize(("header", "ok"), [
    (f"Bearer {KEY}", True),
    (f"bearer {KEY}", True),
    (f"  Bearer   {KEY}  ", True),
    (None, False),
    ("", False),
    ("Bearer", False),
    ("Bearer ", False),
    (f"Basic {KEY}", False),
    (f"Bearer {KEY}x", False),
    (f"Bearer {KEY[:-1]}", False),
    (KEY, False),
])
def test_key_matches(header, ok):
    assert key_matches(header, KEY) is ok


def test_grpc_metadata():
    assert grpc_key_matches((("authorization", f"Bearer {KEY}"),), KEY)
    assert not grpc_key_matches((("authorization", "Bearer nope"),), KEY)
    assert not grpc_key_matches((), KEY)
    assert not grpc_key_matches(None, KEY)
    assert grpc_key_matches((), None)  # no key configured: everyone


@pytest.fixture
def client():
    app = FastAPI()
    for path in ("/health", "/ready", "/metrics", "/workers", "/v1/models"):
        app.add_api_route(path, lambda: {"ok": True})
    app.add_middleware(ApiKeyMiddleware, api_key=KEY)
    return TestClient(app)


@pytest.mark.parametrize("path", ["/v1/models", "/workers", "/v1/chat/completions", "/nowhere"])
def test_guarded_routes_need_the_key(client, path):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        reply = client.get(path, headers=headers)
        assert reply.status_code == 401
        assert reply.headers["www-authenticate"] == "Bearer"
        assert reply.json()["error"]["code"] == "invalid_api_key"
        assert reply.json()["error"]["type"] == "invalid_request_error"


def test_the_key_lets_requests_in(client):
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json() == {"ok": True}


@pytest.mark.parametrize("path", ["/health", "/ready", "/metrics"])
def test_probes_and_metrics_stay_open(client, path):
    assert client.get(path).status_code == 200


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_security_arguments(p)
    return p.parse_args(argv)


def test_flags_from_the_environment(monkeypatch):
    monkeypatch.setenv("EPD_API_KEY", KEY)
    assert _args([]).api_key == KEY
    assert _args(["--api-key", "other"]).api_key == "other"


@pytest.mark.parametrize("argv, fragment", [
    (["--tls-cert", "c.pem"], "go together"),
    (["--tls-key", "k.pem"], "go together"),
    (["--tls-cert", "/nonexistent/c.pem", "--tls-key", "/nonexistent/k.pem"], "/nonexistent/c.pem"),
    (["--api-key", "  "], "empty"),
])
def test_bad_flags(argv, fragment):
    with pytest.raises(ValueError, match=fragment):
        check_security_arguments(_args(argv))


def test_good_tls_files(tmp_path):
    from tests.certs import TestCA

    leaf = TestCA(tmp_path).leaf("server")
    check_security_arguments(_args(["--tls-cert", str(leaf.cert), "--tls-key", str(leaf.key)]))
