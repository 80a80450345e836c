"""Image loading: data URLs, the SSRF guard, decoding (fetching is in test_image_fetch.py)."""

from __future__ import annotations

import asyncio
import base64
import io
import ipaddress
import struct
import time
import zlib

import pytest
from PIL import Image

from router.errors import RequestError
from router.image_source import (
    ImageLimits,
    decode_data_url,
    decode_image,
    is_forbidden_address,
)
from tests.unit.image_source_helpers import (
    LIMITS,
    PNG,
    check,
    check_refused,
    data_url,
    fake_resolver,
    load,
    png_bytes,
    refused,
)

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
