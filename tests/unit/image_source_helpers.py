"""Shared helpers of the image loading tests (data URLs, the SSRF guard, fetching)."""

from __future__ import annotations

import asyncio
import base64
import io
import socket

import httpx
import pytest
from PIL import Image

from router.errors import RequestError
from router.image_source import ImageLimits, check_url_host, load_image_bytes

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
