"""An https image fetch connects to the address the SSRF guard checked, yet verifies the certificate
against the URL's name (SNI): a real TLS server on loopback with a certificate for `localhost` only."""

from __future__ import annotations

import asyncio
import http.server
import ssl
import threading

import httpx
import pytest

from router.errors import RequestError
from router.image_source import load_image_bytes
from tests.certs import TestCA
from tests.unit.image_source_helpers import LIMITS, PNG


class _Png(http.server.BaseHTTPRequestHandler):
    hosts: list[str] = []

    def do_GET(self) -> None:
        self.hosts.append(self.headers["Host"])
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        self.wfile.write(PNG)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def https_server(tmp_path):
    ca = TestCA(tmp_path)
    leaf = ca.leaf("images", with_ip=False)  # valid for "localhost", not for "127.0.0.1"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Png)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(leaf.cert, leaf.key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], ssl.create_default_context(cafile=str(ca.path))
    server.shutdown()
    server.server_close()


def _load(url: str, trust: ssl.SSLContext, resolver) -> bytes:
    async def main() -> bytes:
        async with httpx.AsyncClient(verify=trust, follow_redirects=False) as client:
            return await load_image_bytes(url, client=client, limits=LIMITS, allowed_hosts=frozenset({"127.0.0.0/8"}),
                                          resolver=resolver)

    return asyncio.run(main())


def test_https_fetch_verifies_the_name_while_connecting_to_the_checked_address(https_server):
    port, trust = https_server
    asked: list[str] = []

    async def resolver(host: str, _port: int) -> list[str]:
        asked.append(host)
        return ["127.0.0.1"]

    _Png.hosts.clear()
    assert _load(f"https://localhost:{port}/a.png", trust, resolver) == PNG
    assert asked == ["localhost"]  # one lookup, by the guard; the connection used its answer
    assert _Png.hosts == [f"localhost:{port}"]


def test_https_fetch_with_a_certificate_for_another_name_fails(https_server):
    port, trust = https_server

    async def resolver(host: str, _port: int) -> list[str]:
        return ["127.0.0.1"]

    with pytest.raises(RequestError, match="could not fetch"):  # the certificate does not name this host
        _load(f"https://images.example:{port}/a.png", trust, resolver)
