"""load_image_bytes against real and mock HTTP servers: fetch limits, redirects, the address really used."""
from __future__ import annotations

import asyncio
import contextlib
import http.server
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from router.errors import RequestError
from router.image_source import (
    ImageLimits,
    load_image_bytes,
)
from tests.unit.image_source_helpers import (
    LIMITS,
    NO_HOSTS,
    PNG,
    fake_resolver,
    load,
    refused,
)

# --- fetching from a real loopback server -----------------------------------------------------------

BIG = b"x" * 10_000


class _Handler(http.server.BaseHTTPRequestHandler):
    routes = {
        "/redirect-internal": "http://10.0.0.1/x.png",
        "/redirect-png": "/png",
        "/loop": "/loop",
        "/redirect-file": "file:///etc/passwd",
    }

    def do_GET(self) -> None:
        # The client may give up first, which is what some tests are about.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self._route()

    def _route(self) -> None:
        if self.path in self.routes:
            self.send_response(302)
            self.send_header("Location", self.routes[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/png":
            self._send(200, PNG)
        elif self.path == "/big":
            self._send(200, BIG)
        elif self.path == "/big-stream":
            # No Content-Length: the body ends when the connection closes, so only counting stops it.
            self.send_response(200)
            self.end_headers()
            for start in range(0, len(BIG), 1000):
                self.wfile.write(BIG[start : start + 1000])
                self.wfile.flush()
        elif self.path == "/slow":
            time.sleep(1.5)
            self._send(200, PNG)
        else:
            self._send(404, b"not found")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


def test_fetch_png(server):
    assert load(f"{server}/png") == PNG


def test_fetch_allowed_by_host_and_port(server):
    port = server.rsplit(":", 1)[1]
    assert load(f"{server}/png", allowed=frozenset({f"127.0.0.1:{port}"})) == PNG


def test_fetch_from_loopback_refused_without_allowance(server):
    message = refused(f"{server}/png", allowed=NO_HOSTS)
    assert "address 127.0.0.1 is not allowed" in message
    assert message.endswith("--allow-url-host 127.0.0.1")


def test_fetch_not_found(server):
    assert refused(f"{server}/missing") == f"fetching the image {server}/missing failed: the server answered HTTP 404"


def test_fetch_over_the_limit_by_content_length(server):
    assert refused(f"{server}/big", ImageLimits(max_bytes=1000)) == (
        f"the image {server}/big is larger than the limit of 1000 bytes"
    )


def test_fetch_over_the_limit_while_streaming(server):
    assert refused(f"{server}/big-stream", ImageLimits(max_bytes=2500)) == (
        f"the image {server}/big-stream is larger than the limit of 2500 bytes"
    )


def test_fetch_streamed_body_within_the_limit(server):
    assert load(f"{server}/big-stream", ImageLimits(max_bytes=len(BIG))) == BIG


def test_fetch_times_out(server):
    started = time.monotonic()
    message = refused(f"{server}/slow", ImageLimits(fetch_timeout_s=0.3))
    assert message == f"fetching the image {server}/slow timed out after 0.3 s"
    assert time.monotonic() - started < 1.4  # gave up before the server answered


def test_redirect_to_a_disallowed_host_is_refused(server):
    message = refused(f"{server}/redirect-internal")
    assert message.startswith("the image URL address 10.0.0.1 is not allowed")


def test_relative_redirect_is_followed(server):
    assert load(f"{server}/redirect-png") == PNG


def test_redirects_are_bounded(server):
    assert refused(f"{server}/loop") == f"fetching the image {server}/loop took more than 3 redirects"
    message = refused(f"{server}/redirect-png", ImageLimits(max_redirects=0))
    assert message == f"fetching the image {server}/png took more than 0 redirects"


def test_redirect_to_another_scheme_is_refused(server):
    assert refused(f"{server}/redirect-file") == "the image URL redirected to an unsupported scheme 'file'"


def test_connection_refused_is_a_request_error():
    with socket.socket() as probe:  # a port that was free a moment ago, with nothing listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    message = refused(f"http://127.0.0.1:{port}/a.png")
    assert message.startswith(f"could not fetch the image http://127.0.0.1:{port}/a.png: ConnectError")


# --- fetching through a mock transport: which address is really connected to ----------------------


def mock_load(url: str, handler, answers: dict[str, list[str]]) -> bytes:
    async def main() -> bytes:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler), follow_redirects=False) as client:
            return await load_image_bytes(url, client=client, limits=LIMITS, allowed_hosts=NO_HOSTS,
                                          resolver=fake_resolver(answers))

    return asyncio.run(main())


def test_http_connects_to_the_checked_address():
    seen: list[tuple[str, int | None, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, request.url.port, request.headers["host"]))
        return httpx.Response(200, content=PNG)

    assert mock_load("http://images.example:8080/cat.png", handler, {"images.example": ["93.184.216.34"]}) == PNG
    assert seen == [("93.184.216.34", 8080, "images.example:8080")]


def test_https_connects_to_the_checked_address_with_the_name_in_sni():
    seen: list[tuple[str, str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.host, request.headers["host"], request.extensions["sni_hostname"]))
        return httpx.Response(200, content=PNG)

    assert mock_load("https://images.example/cat.png", handler, {"images.example": ["93.184.216.34"]}) == PNG
    assert seen == [("93.184.216.34", "images.example", "images.example")]


@pytest.mark.parametrize("content_type", ["text/html; charset=utf-8", "application/json", "video/mp4"])
def test_non_image_media_types_are_refused(content_type):
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=PNG, headers={"Content-Type": content_type})

    with pytest.raises(RequestError) as info:
        mock_load("http://images.example/cat.png", handler, {"images.example": ["93.184.216.34"]})
    assert "not an image media type" in info.value.message


@pytest.mark.parametrize("content_type", ["image/png", "IMAGE/JPEG; q=1", "application/octet-stream", None])
def test_image_and_untyped_media_types_pass(content_type):
    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"Content-Type": content_type} if content_type else {}
        return httpx.Response(200, content=PNG, headers=headers)

    assert mock_load("http://images.example/cat.png", handler, {"images.example": ["93.184.216.34"]}) == PNG


def test_every_redirect_hop_is_checked():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(302, headers={"Location": "http://evil.example/meta"})

    answers = {"images.example": ["93.184.216.34"], "evil.example": ["169.254.169.254"]}
    with pytest.raises(RequestError) as info:
        mock_load("http://images.example/cat.png", handler, answers)
    assert "host evil.example resolves to 169.254.169.254, which is not allowed" in info.value.message
