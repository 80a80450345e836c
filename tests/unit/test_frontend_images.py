"""Frontend._image: a file the router has decoded before is not decoded again, and a bad one is
refused every time it comes (only files that passed every check are remembered)."""

from __future__ import annotations

import asyncio
import base64
import io

import httpx
import pytest
from PIL import Image

import router.frontend as frontend_module
from epd.digest import pixel_digest
from router.errors import RequestError
from router.frontend import Frontend
from router.image_source import ImageLimits
from router.offload import Offload


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def png(size=(16, 8), color=(90, 20, 200)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def decodes(monkeypatch):
    seen = []
    real = frontend_module.decode_image
    monkeypatch.setattr(frontend_module, "decode_image",
                        lambda data, limits: seen.append(len(data)) or real(data, limits))
    return seen


def load(urls: list[str]) -> list:
    async def go():
        frontend = Frontend(tokenizer=None, http=httpx.AsyncClient(), image_limits=ImageLimits(),
                            allowed_hosts=frozenset(), max_prompt_tokens=100, request_timeout_s=5,
                            offload=Offload(1))
        try:
            out = []
            for url in urls:
                try:
                    out.append(await frontend._image(url, "messages[0].content[0]"))
                except RequestError as exc:
                    out.append(exc)
            return out
        finally:
            await frontend.http.aclose()
            frontend.offload.close()
    return asyncio.run(go())


def test_a_file_sent_again_keeps_its_pixel_digest_without_a_second_decode(decodes):
    data = png()
    first, again = load([data_url(data), data_url(data)])
    assert first.pixel_digest == again.pixel_digest == pixel_digest(Image.open(io.BytesIO(data)).convert("RGB"))
    assert again.data == data
    assert len(decodes) == 1


def test_another_file_is_decoded(decodes):
    a, b = load([data_url(png(color=(1, 2, 3))), data_url(png(color=(4, 5, 6)))])
    assert a.pixel_digest != b.pixel_digest
    assert len(decodes) == 2


def test_a_refused_file_is_refused_again_every_time(decodes):
    thin = data_url(png(size=(300, 1)))
    outcomes = load([thin, thin])
    assert all(isinstance(o, RequestError) and "each side must be at least" in str(o) for o in outcomes)
    assert outcomes[1].param == "messages[0].content[0]"
    assert len(decodes) == 2
