"""Turn one image URL from a chat request into decoded pixels, under limits and an SSRF guard.

The router is the only component that touches client-supplied URLs and raw image bytes, so every
way they can hurt the cluster is stopped here: oversized bodies (capped while streaming, never
buffered whole), decompression bombs (pixel count checked from the header, before decoding), slow
servers (one deadline over all redirect hops) and requests into the cluster's own network (every
hop's host resolved and refused when any address is internal, unless the operator allow-listed it).
Bad input only ever surfaces as `RequestError` (400), never as a 500.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import ipaddress
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
from PIL import Image

from router.errors import RequestError

# (host, port) -> IP address strings; injectable so tests need no DNS.
Resolver = Callable[[str, int], Awaitable[list[str]]]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Cloud instance-metadata endpoints (AWS v4 and v6, Alibaba): the classic SSRF prize. Each is also
# caught by the range checks; listed so that no future change to those checks can let them through.
_METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)
# NAT64's well-known prefix embeds an IPv4 address that a NAT64 gateway will connect to.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_DEFAULT_PORTS = {"http": 80, "https": 443}
# The formats browsers and the OpenAI API accept; the rest of Pillow's openers are attack surface.
DEFAULT_FORMATS = ("PNG", "JPEG", "MPO", "WEBP", "GIF", "BMP", "TIFF")
# Fetched bodies must say they are images; servers that do not know say octet-stream (or nothing),
# and Pillow then decides from the bytes, within the allowed formats.
_UNTYPED = ("", "application/octet-stream", "binary/octet-stream")
_SHOWN_URL_CHARS = 100
MAX_URL_CHARS = 8192  # what common servers and proxies accept in a request line


@dataclass(frozen=True)
class ImageLimits:
    """What one image may cost the router."""

    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 33_177_600  # 4K x 4 (7680 x 4320)
    fetch_timeout_s: float = 10.0  # the whole fetch: lookups, every redirect hop, the body
    max_redirects: int = 3
    formats: tuple[str, ...] = DEFAULT_FORMATS  # Pillow format names
    # A 1xN image has no patch grid: refused here, not by the encoder's resize (which fails the
    # whole micro-batch). Qwen-VL's resize refuses aspect ratios over 200.
    min_side: int = 2
    max_aspect_ratio: float = 200.0

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.max_pixels < 1 or self.min_side < 1:
            raise ValueError(f"ImageLimits max_bytes, max_pixels and min_side must be >= 1, got {self}")
        if not self.max_aspect_ratio >= 1:
            raise ValueError(f"ImageLimits.max_aspect_ratio must be >= 1, got {self.max_aspect_ratio}")
        Image.init()
        unknown = [f for f in self.formats if f not in Image.OPEN and f not in Image.MIME]
        if not self.formats or unknown:
            raise ValueError(f"ImageLimits.formats: unknown image formats {unknown or 'none given'}; "
                             f"Pillow reads {', '.join(sorted(Image.OPEN))}")
        if not self.fetch_timeout_s > 0:
            raise ValueError(f"ImageLimits.fetch_timeout_s must be > 0, got {self.fetch_timeout_s}")
        if self.max_redirects < 0:
            raise ValueError(f"ImageLimits.max_redirects must be >= 0, got {self.max_redirects}")


async def load_image_bytes(
    url: str,
    *,
    client: httpx.AsyncClient,
    limits: ImageLimits,
    allowed_hosts: frozenset[str],
    resolver: Resolver | None = None,
) -> bytes:
    """The encoded bytes behind a `data:` or `http(s)` image URL, within `limits`."""
    if not isinstance(url, str):
        raise RequestError(f"an image URL must be a string, got {type(url).__name__}")
    scheme = url.partition(":")[0].lower() if ":" in url else ""
    if scheme == "data":
        return decode_data_url(url, limits)
    if scheme in _DEFAULT_PORTS:
        if len(url) > MAX_URL_CHARS:  # parsed on the event loop: keep that cheap
            raise RequestError(f"the image URL is {len(url)} characters; the limit is {MAX_URL_CHARS}")
        return await _fetch(url, client, limits, allowed_hosts, resolver)
    raise RequestError(
        f"unsupported image URL scheme {scheme[:16]!r}: send a data:image/...;base64,... URL or an http(s) URL"
    )


def decode_data_url(url: str, limits: ImageLimits) -> bytes:
    """The bytes of a `data:image/<type>;base64,<data>` URL."""
    header, comma, payload = url[len("data:") :].partition(",")
    if not comma:
        raise RequestError("the image data URL has no ',' before its data (expected data:image/png;base64,...)")
    mime, *params = (p.strip().lower() for p in header.split(";"))
    if not mime.startswith("image/"):
        raise RequestError(f"the data URL must carry an image (data:image/...), not {mime[:40] or 'no'} media type")
    if "base64" not in params:
        raise RequestError("the image data URL must be base64-encoded (data:image/png;base64,...)")
    # Clients wrap base64 at 76 columns; whitespace is never data.
    payload = "".join(payload.split())
    if not payload:
        raise RequestError("the image data URL is empty")
    # Refuse from the length alone, before decoding tens of megabytes only to throw them away.
    if len(payload) // 4 * 3 - payload[-2:].count("=") > limits.max_bytes:
        raise RequestError(f"the image in the data URL is larger than the limit of {limits.max_bytes} bytes")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise RequestError("the image data URL is not valid base64") from None


def decode_image(data: bytes, limits: ImageLimits) -> Image.Image:
    """Fully decoded RGB pixels; the size is checked from the header before any pixel is decoded.

    CPU-bound (milliseconds to a second for large images): call it off the event loop.
    """
    try:
        with Image.open(io.BytesIO(data), formats=limits.formats) as image:
            check_dimensions(*image.size, limits)
            # Decode now, so a truncated or corrupt file fails here and not inside the encoder.
            image.load()
            return image.convert("RGB")
    except RequestError:
        raise
    except Image.DecompressionBombError:
        # Pillow's own guard fires inside open() for absurd sizes, before our check sees them.
        raise RequestError(f"the image is over the limit of {limits.max_pixels} pixels") from None
    except Exception as exc:  # Pillow's decoders raise OSError, SyntaxError, ValueError, struct.error, ...
        raise RequestError(
            f"the image data is not a readable image (supported: {', '.join(limits.formats)}): {str(exc)[:200]}"
        ) from None


def check_dimensions(width: int, height: int, limits: ImageLimits) -> None:
    """Refuse, from the header's size alone, an image too large or too thin to encode."""
    if width * height > limits.max_pixels:
        raise RequestError(
            f"the image is {width}x{height} = {width * height} pixels, over the limit of {limits.max_pixels} pixels"
        )
    if min(width, height) < limits.min_side:
        raise RequestError(f"the image is {width}x{height} pixels; each side must be at least {limits.min_side}")
    if max(width, height) / min(width, height) > limits.max_aspect_ratio:
        raise RequestError(f"the image is {width}x{height} pixels, an aspect ratio over the limit of "
                           f"{limits.max_aspect_ratio:g}")


# --- SSRF guard -------------------------------------------------------------------------------------


async def check_url_host(
    url: str,
    allowed_hosts: frozenset[str],
    *,
    resolver: Resolver | None = None,
    timeout_s: float = 10.0,
) -> str | None:
    """Refuse a URL whose host resolves to any internal address; return the address to connect to.

    None means the host is allow-listed (exact name, or "name:port", case-insensitive) and is to
    be connected to by name. Any internal address refuses the host, not just the first one: a
    client that can make a name resolve to one public and one private address otherwise gets in.
    An allow-list entry that is a network ("10.1.0.0/16", "::1/128") lets internal addresses inside
    it through; the connection still goes to the checked address.
    """
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise RequestError(f"invalid image URL: {exc}") from None
    host = parsed.raw_host.decode("ascii").lower()
    if not host:
        raise RequestError(f"the image URL {_shown(url)} has no host")
    port = parsed.port or _DEFAULT_PORTS.get(parsed.scheme, 0)
    if _is_allowed(host, port, _unicode_host(parsed, host), allowed_hosts):
        return None
    literal = _ip_literal(host)
    addresses = [literal] if literal is not None else await _resolve(host, port, resolver, timeout_s)
    networks = allowed_networks(allowed_hosts)
    for address in addresses:
        if is_forbidden_address(address) and not any(address in net for net in networks):
            where = f"address {host}" if literal is not None else f"host {host} resolves to {address}, which"
            raise RequestError(
                f"the image URL {where} is not allowed: loopback, private, link-local and cloud metadata "
                f"addresses are refused. An operator can allow this host with --allow-url-host {host}"
            )
    return str(addresses[0])


def is_forbidden_address(address: IPAddress) -> bool:
    """True for any address an outside client must not make the router connect to."""
    if isinstance(address, ipaddress.IPv6Address):
        # IPv4 addresses embedded in IPv6 forms reach the IPv4 host; judge that host.
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
        if embedded is not None and is_forbidden_address(embedded):
            return True
    return (
        address in _METADATA_ADDRESSES
        or address.is_loopback
        or address.is_private
        or address.is_link_local
        or address.is_unspecified
        or address.is_multicast  # some multicast ranges count as "global"
        or address.is_reserved
        or not address.is_global  # also shared address space (100.64/10), benchmarking ranges, ...
    )


def allowed_networks(allowed_hosts: frozenset[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The allow-list entries written as networks (with a '/'); names and plain addresses are not."""
    networks = []
    for entry in allowed_hosts:
        if "/" in entry:
            try:
                networks.append(ipaddress.ip_network(entry.strip(), strict=False))
            except ValueError:
                raise ValueError(f"--allow-url-host {entry!r}: not a network like 10.0.0.0/8 or fd00::/8") from None
    return networks


def _is_allowed(host: str, port: int, display_host: str, allowed_hosts: frozenset[str]) -> bool:
    if not allowed_hosts:
        return False
    allowed = {entry.strip().lower() for entry in allowed_hosts}
    names = {host, display_host}
    names |= {f"[{name}]" for name in names if ":" in name}  # IPv6 literals, bracketed or not
    return any(name in allowed or f"{name}:{port}" in allowed for name in names)


def _unicode_host(parsed: httpx.URL, ascii_host: str) -> str:
    """The host as an operator would type it in --allow-url-host ("bücher.example", not "xn--…")."""
    try:
        return parsed.host.lower()
    except UnicodeError:  # a malformed "xn--" label; the ASCII form is all there is
        return ascii_host


def _ip_literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


async def _resolve(host: str, port: int, resolver: Resolver | None, timeout_s: float) -> list[IPAddress]:
    try:
        async with asyncio.timeout(timeout_s):
            raw = await (resolver or _system_resolver)(host, port)
    except TimeoutError:
        raise RequestError(f"looking up the image URL host {_shown(host)} timed out") from None
    except (OSError, UnicodeError) as exc:  # socket.gaierror is an OSError
        raise RequestError(f"cannot resolve the image URL host {_shown(host)}: {exc}") from None
    try:
        # getaddrinfo writes link-local IPv6 answers with a zone ("fe80::1%eth0").
        addresses = [ipaddress.ip_address(a.partition("%")[0]) for a in raw]
    except ValueError:
        raise RequestError(f"cannot resolve the image URL host {_shown(host)}: bad address in the answer") from None
    if not addresses:
        raise RequestError(f"cannot resolve the image URL host {_shown(host)}: no addresses")
    return addresses


async def _system_resolver(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


# --- fetching ---------------------------------------------------------------------------------------


async def _fetch(
    url: str, client: httpx.AsyncClient, limits: ImageLimits, allowed_hosts: frozenset[str], resolver: Resolver | None
) -> bytes:
    shown = _shown(url)
    try:
        async with asyncio.timeout(limits.fetch_timeout_s):
            return await _fetch_hops(url, client, limits, allowed_hosts, resolver)
    except (TimeoutError, httpx.TimeoutException):
        raise RequestError(f"fetching the image {shown} timed out after {limits.fetch_timeout_s:g} s") from None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise RequestError(f"could not fetch the image {shown}: {type(exc).__name__}: {str(exc)[:200]}") from None


async def _fetch_hops(
    url: str, client: httpx.AsyncClient, limits: ImageLimits, allowed_hosts: frozenset[str], resolver: Resolver | None
) -> bytes:
    """Follow redirects by hand so that every hop passes the SSRF guard, not only the first."""
    for _ in range(limits.max_redirects + 1):
        scheme = httpx.URL(url).scheme
        if scheme not in _DEFAULT_PORTS:
            raise RequestError(f"the image URL redirected to an unsupported scheme {scheme[:16]!r}")
        address = await check_url_host(url, allowed_hosts, resolver=resolver, timeout_s=limits.fetch_timeout_s)
        request = _build_request(client, url, address, limits)
        response = await client.send(request, stream=True, follow_redirects=False)
        try:
            if response.is_redirect:
                url = str(httpx.URL(url).join(response.headers["location"]))
                continue
            if not response.is_success:
                raise RequestError(
                    f"fetching the image {_shown(url)} failed: the server answered HTTP {response.status_code}"
                )
            _check_media_type(response, url)
            return await _read_capped(response, limits.max_bytes, url)
        finally:
            await response.aclose()
    raise RequestError(f"fetching the image {_shown(url)} took more than {limits.max_redirects} redirects")


def _check_media_type(response: httpx.Response, url: str) -> None:
    media_type = response.headers.get("content-type", "").partition(";")[0].strip().lower()
    if not media_type.startswith("image/") and media_type not in _UNTYPED:
        raise RequestError(f"the image URL {_shown(url)} answered with {media_type[:60]!r}, not an image media type")


def _build_request(client: httpx.AsyncClient, url: str, address: str | None, limits: ImageLimits) -> httpx.Request:
    target = httpx.URL(url)
    headers = {"Accept": "image/*"}
    extensions = {}
    # Connect to the very address that was checked, so a second DNS answer cannot point inside
    # the network (DNS rebinding). For https the name still goes in SNI and is what the
    # certificate is checked against.
    if address is not None:
        headers["Host"] = target.netloc.decode("ascii")
        if target.scheme == "https":
            extensions["sni_hostname"] = target.host
        target = target.copy_with(host=address)
    return client.build_request("GET", target, headers=headers, timeout=limits.fetch_timeout_s, extensions=extensions)


async def _read_capped(response: httpx.Response, max_bytes: int, url: str) -> bytes:
    """The body, aborting as soon as it passes `max_bytes` (decoded size: gzip bombs count)."""
    too_large = f"the image {_shown(url)} is larger than the limit of {max_bytes} bytes"
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise RequestError(too_large)
    chunks: list[bytes] = []
    total = 0
    async for chunk in response.aiter_bytes():
        total += len(chunk)
        if total > max_bytes:
            raise RequestError(too_large)
        chunks.append(chunk)
    return b"".join(chunks)


def _shown(url: str) -> str:
    """A URL short enough to put in an error message."""
    return url if len(url) <= _SHOWN_URL_CHARS else url[: _SHOWN_URL_CHARS - 3] + "..."
