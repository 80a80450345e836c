"""Image loading: data URLs, the SSRF guard, fetching under limits (a real loopback server), decoding."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.server
import io
import ipaddress
import socket
import struct
import threading
import time
import zlib
from collections.abc import Iterator

import httpx
import pytest
from PIL import Image

from router.errors import RequestError
from router.image_source import (
    ImageLimits,
    check_url_host,
    decode_data_url,
    decode_image,
    is_forbidden_address,
    load_image_bytes,
)

LIMITS = ImageLimits()
NO_HOSTS: frozenset[str] = frozenset()
LOCAL = frozenset({"127.0.0.1"})


def png_bytes(size: tuple[int, int] = (4, 3), color: tuple[int, ...] = (255, 0, 0, 128), mode: str = "RGBA") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, color).save(buffer, format="PNG")
    return buffer.getvalue()


PNG = png_bytes()


def data_url(payload: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(payload).decode()}"


def fake_resolver(answers: dict[str, list[str]], calls: list[tuple[str, int]] | None = None):
    async def resolve(host: str, port: int) -> list[str]:
        if calls is not None:
            calls.append((host, port))
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return answers[host]

    return resolve


def load(url: str, limits: ImageLimits = LIMITS, allowed: frozenset[str] = LOCAL, **kwargs) -> bytes:
    async def main() -> bytes:
        async with httpx.AsyncClient(follow_redirects=False, trust_env=False) as client:
            return await load_image_bytes(url, client=client, limits=limits, allowed_hosts=allowed, **kwargs)

    return asyncio.run(main())


def refused(url: str, limits: ImageLimits = LIMITS, allowed: frozenset[str] = LOCAL, **kwargs) -> str:
    with pytest.raises(RequestError) as info:
        load(url, limits, allowed, **kwargs)
    assert info.value.status == 400
    assert info.value.type == "invalid_request_error"
    return info.value.message


def check(url: str, allowed: frozenset[str] = NO_HOSTS, **kwargs) -> str | None:
    return asyncio.run(check_url_host(url, allowed, **kwargs))


def check_refused(url: str, allowed: frozenset[str] = NO_HOSTS, **kwargs) -> str:
    with pytest.raises(RequestError) as info:
        check(url, allowed, **kwargs)
    assert info.value.status == 400
    return info.value.message


# --- data URLs --------------------------------------------------------------------------------------


def test_data_url_round_trips():
    assert load(data_url(PNG)) == PNG


def test_data_url_with_line_breaks_and_upper_case():
    encoded = base64.b64encode(PNG).decode()
    wrapped = "\n".join(encoded[i : i + 76] for i in range(0, len(encoded), 76))
    assert load("DATA:IMAGE/PNG;BASE64," + wrapped) == PNG


def test_data_url_exactly_at_the_byte_limit():
    assert decode_data_url(data_url(b"0123456789"), ImageLimits(max_bytes=10)) == b"0123456789"


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        (data_url(PNG, "text/plain"), "must carry an image (data:image/...), not text/plain media type"),
        ("data:;base64,AAAA", "not no media type"),
        ("data:image/png," + "abc", "must be base64-encoded"),
        ("data:image/png;base64,@@@@", "is not valid base64"),
        ("data:image/png;base64,abc", "is not valid base64"),
        ("data:image/png;base64", "has no ','"),
        ("data:image/png;base64,", "is empty"),
    ],
)
def test_bad_data_urls(url, fragment):
    assert fragment in refused(url)


def test_data_url_over_the_byte_limit():
    message = refused(data_url(b"01234567890"), ImageLimits(max_bytes=10))
    assert message == "the image in the data URL is larger than the limit of 10 bytes"


@pytest.mark.parametrize(
    ("url", "scheme"),
    [("ftp://example.com/a.png", "ftp"), ("file:///etc/passwd", "file"), ("/a.png", ""), ("gopher://x", "gopher")],
)
def test_unsupported_schemes(url, scheme):
    assert f"unsupported image URL scheme {scheme!r}" in refused(url)


def test_url_must_be_a_string():
    assert "must be a string, got int" in refused(42)  # type: ignore[arg-type]


# --- SSRF guard -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://127.0.0.1/a.png", "127.0.0.1"),
        ("http://10.1.2.3/", "10.1.2.3"),
        ("http://172.16.0.1/", "172.16.0.1"),
        ("http://192.168.1.10:8080/x", "192.168.1.10"),
        ("http://169.254.169.254/latest/meta-data/", "169.254.169.254"),
        ("http://100.100.100.200/", "100.100.100.200"),
        ("http://0.0.0.0/", "0.0.0.0"),
        ("http://224.0.0.1/", "224.0.0.1"),
        ("http://[::1]/", "::1"),
        ("https://[fd00:ec2::254]/", "fd00:ec2::254"),
        ("http://[::ffff:127.0.0.1]/", "::ffff:127.0.0.1"),
        ("http://[64:ff9b::a00:1]/", "64:ff9b::a00:1"),
        ("http://[fe80::1]/", "fe80::1"),
    ],
)
def test_internal_literals_are_refused(url, host):
    message = check_refused(url, resolver=fake_resolver({}))
    assert message.startswith(f"the image URL address {host} is not allowed: loopback, private")
    assert message.endswith(f"--allow-url-host {host}")


def test_hostname_resolving_to_a_private_address_is_refused():
    calls: list[tuple[str, int]] = []
    message = check_refused("http://internal.example/cat.png", resolver=fake_resolver(
        {"internal.example": ["10.0.0.7"]}, calls))
    assert "host internal.example resolves to 10.0.0.7, which is not allowed" in message
    assert "--allow-url-host internal.example" in message
    assert calls == [("internal.example", 80)]


def test_any_internal_answer_refuses_the_host():
    resolver = fake_resolver({"mixed.example": ["93.184.216.34", "2606:4700::1", "192.168.0.3"]})
    assert "resolves to 192.168.0.3" in check_refused("https://mixed.example/", resolver=resolver)


def test_link_local_answer_with_a_zone_is_refused():
    resolver = fake_resolver({"ll.example": ["fe80::1%eth0"]})
    assert "resolves to fe80::1, which is not allowed" in check_refused("http://ll.example/", resolver=resolver)


def test_public_host_returns_the_checked_address():
    calls: list[tuple[str, int]] = []
    resolver = fake_resolver({"images.example": ["93.184.216.34", "93.184.216.35"]}, calls)
    assert check("https://Images.Example/a.png", resolver=resolver) == "93.184.216.34"
    assert calls == [("images.example", 443)]


def test_public_literal_needs_no_lookup():
    assert check("http://8.8.8.8:8080/a.png", resolver=fake_resolver({})) == "8.8.8.8"
    assert check("http://[2606:4700::1]/", resolver=fake_resolver({})) == "2606:4700::1"


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://internal.example/a.png", {"internal.example"}),
        ("http://Internal.EXAMPLE/a.png", {"INTERNAL.example"}),
        ("http://internal.example:8080/a.png", {"internal.example:8080"}),
        ("http://internal.example/a.png", {"internal.example:80"}),
        ("https://internal.example/a.png", {"internal.example:443"}),
        ("http://127.0.0.1:9000/", {"127.0.0.1"}),
        ("http://169.254.169.254/", {"169.254.169.254"}),
        ("http://[::1]:8000/", {"[::1]:8000"}),
        ("http://[::1]/", {"::1"}),
    ],
)
def test_allowed_hosts_skip_the_check(url, allowed):
    calls: list[tuple[str, int]] = []
    assert check(url, frozenset(allowed), resolver=fake_resolver({"internal.example": ["10.0.0.7"]}, calls)) is None
    assert calls == []


def test_allowed_host_port_does_not_allow_other_ports():
    resolver = fake_resolver({"internal.example": ["10.0.0.7"]})
    message = check_refused("http://internal.example:9090/", frozenset({"internal.example:8080"}), resolver=resolver)
    assert "resolves to 10.0.0.7" in message


def test_unresolvable_host():
    message = check_refused("http://nowhere.example/", resolver=fake_resolver({}))
    assert message.startswith("cannot resolve the image URL host nowhere.example:")


def test_empty_answer():
    message = check_refused("http://empty.example/", resolver=fake_resolver({"empty.example": []}))
    assert message == "cannot resolve the image URL host empty.example: no addresses"


def test_hanging_resolver_times_out():
    async def hang(host: str, port: int) -> list[str]:
        await asyncio.sleep(30)
        return []

    started = time.monotonic()
    message = check_refused("http://slow.example/", resolver=hang, timeout_s=0.05)
    assert message == "looking up the image URL host slow.example timed out"
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "93.184.216.34", "2606:4700::1", "2a00:1450::1"])
def test_public_addresses_are_not_forbidden(address):
    assert is_forbidden_address(ipaddress.ip_address(address)) is False


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


def test_https_connects_by_name():
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        return httpx.Response(200, content=PNG)

    assert mock_load("https://images.example/cat.png", handler, {"images.example": ["93.184.216.34"]}) == PNG
    assert seen == ["images.example"]


def test_every_redirect_hop_is_checked():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(302, headers={"Location": "http://evil.example/meta"})

    answers = {"images.example": ["93.184.216.34"], "evil.example": ["169.254.169.254"]}
    with pytest.raises(RequestError) as info:
        mock_load("http://images.example/cat.png", handler, answers)
    assert "host evil.example resolves to 169.254.169.254, which is not allowed" in info.value.message


# --- decoding ---------------------------------------------------------------------------------------


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares a size but carries no real pixels: what a decompression bomb looks like."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"\x00") + chunk(b"IEND", b"")


def test_decode_converts_to_rgb():
    image = decode_image(PNG, LIMITS)
    assert (image.mode, image.size) == ("RGB", (4, 3))
    assert image.getpixel((3, 2)) == (255, 0, 0)


def test_decode_at_the_pixel_limit():
    assert decode_image(png_bytes((100, 100)), ImageLimits(max_pixels=10_000)).size == (100, 100)


def test_decode_over_the_pixel_limit():
    with pytest.raises(RequestError) as info:
        decode_image(png_bytes((100, 100)), ImageLimits(max_pixels=9_999))
    assert info.value.message == "the image is 100x100 = 10000 pixels, over the limit of 9999 pixels"


def test_size_is_checked_before_pixels_are_decoded():
    with pytest.raises(RequestError) as info:
        decode_image(png_header(6000, 6000), LIMITS)  # no pixel data: decoding would fail differently
    assert info.value.message == "the image is 6000x6000 = 36000000 pixels, over the limit of 33177600 pixels"


def test_decompression_bomb_caught_by_pillow_is_a_request_error():
    with pytest.raises(RequestError) as info:
        decode_image(png_header(20_000, 20_000), LIMITS)
    assert info.value.message == "the image is over the limit of 33177600 pixels"


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"definitely not an image",
        png_bytes((64, 64), (1, 2, 3), "RGB")[:60],  # truncated inside the pixel data
        png_header(8, 8),  # a valid header with garbage pixel data
    ],
)
def test_unreadable_data(data):
    with pytest.raises(RequestError) as info:
        decode_image(data, LIMITS)
    assert info.value.status == 400
    assert info.value.message.startswith("the image data is not a readable image (supported: PNG, JPEG,")


def test_formats_outside_the_web_set_are_refused():
    buffer = io.BytesIO()
    Image.new("RGB", (2, 2)).save(buffer, format="PPM")
    with pytest.raises(RequestError) as info:
        decode_image(buffer.getvalue(), LIMITS)
    assert "is not a readable image" in info.value.message


def test_bad_limits():
    with pytest.raises(ValueError, match="fetch_timeout_s must be > 0"):
        ImageLimits(fetch_timeout_s=0)
    with pytest.raises(ValueError, match="max_redirects must be >= 0"):
        ImageLimits(max_redirects=-1)
