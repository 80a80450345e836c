"""The gateway's limits: body size, JSON parsing, context length, image dimensions, the CPU pool, the flags."""

from __future__ import annotations

import argparse
import asyncio
import io
import threading
from types import SimpleNamespace

import pytest
from PIL import Image

from router.errors import RequestError
from router.image_source import ImageLimits, check_dimensions, decode_image
from router.limit_args import add_limit_arguments, image_limits, request_limits
from router.limits import context_length, fit_max_tokens, parse_json_body, read_body_capped
from router.offload import Offload
from tests.png_bombs import png_claiming


async def _chunks(*parts: bytes):
    for part in parts:
        yield part


def _read(parts: list[bytes], declared: str | None, limit: int) -> bytes:
    return asyncio.run(read_body_capped(_chunks(*parts), declared, limit))


# --- body size --------------------------------------------------------------------------------------


def test_body_within_the_limit_is_read_whole():
    assert _read([b"ab", b"cd"], "4", 4) == b"abcd"


def test_declared_length_over_the_limit_is_refused_before_reading():
    consumed = []

    async def chunks():
        consumed.append(True)
        yield b"x"

    with pytest.raises(RequestError) as info:
        asyncio.run(read_body_capped(chunks(), "1000", 999))
    assert (info.value.status, info.value.code) == (413, "request_too_large")
    assert "1000 bytes" in info.value.message and "999" in info.value.message
    assert consumed == []


def test_chunked_body_is_cut_off_once_over_the_limit():
    consumed = []

    async def chunks():
        for _ in range(100):
            consumed.append(True)
            yield b"x" * 10

    with pytest.raises(RequestError) as info:
        asyncio.run(read_body_capped(chunks(), None, 25))
    assert info.value.status == 413
    assert len(consumed) == 3  # stopped at the chunk that passed 25 bytes, not at the end


def test_a_body_that_trickles_in_is_cut_off_with_408():
    async def slow():
        yield b"{"
        await asyncio.sleep(10)
        yield b"}"

    with pytest.raises(RequestError) as info:
        asyncio.run(read_body_capped(slow(), None, 100, timeout_s=0.2))
    assert (info.value.status, info.value.code) == (408, "request_timeout")


# --- JSON -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, fragment", [
    (b"", "empty"),
    (b"   \n", "empty"),
    (b"{", "not valid JSON"),
    (b"\xff\xfe{}", "not valid JSON"),
    (b'{"max_tokens": ' + b"9" * 5000 + b"}", "not valid JSON"),  # over Python's int digit limit
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "nested too deeply"),
])
def test_bad_json_is_a_400(raw, fragment):
    with pytest.raises(RequestError) as info:
        parse_json_body(raw)
    assert info.value.status == 400
    assert fragment in info.value.message


def test_deep_nesting_is_refused_on_a_pool_thread_too():
    # The router parses on its CPU pool; the recursion guard must hold there as well.
    async def main():
        return await Offload(1).run(parse_json_body, b"[" * 200_000)

    with pytest.raises(RequestError):
        asyncio.run(main())


def test_good_json():
    assert parse_json_body(b'{"messages": []}') == {"messages": []}


# --- context ----------------------------------------------------------------------------------------


def test_context_length_prefers_the_text_config():
    config = SimpleNamespace(text_config=SimpleNamespace(max_position_embeddings=4096), max_position_embeddings=9)
    assert context_length(config) == 4096
    assert context_length(SimpleNamespace(max_position_embeddings=2048)) == 2048
    assert context_length(SimpleNamespace()) is None


def test_fit_max_tokens():
    assert fit_max_tokens(100, 50, True, 200) == 50
    assert fit_max_tokens(100, 100, True, 200) == 100  # exactly full
    assert fit_max_tokens(100, 500, False, 200) == 100  # a defaulted max_tokens shrinks to fit
    assert fit_max_tokens(100, 500, True, None) == 500  # unknown context: not checked here
    with pytest.raises(RequestError) as info:
        fit_max_tokens(100, 101, True, 200)
    assert (info.value.param, info.value.code) == ("max_tokens", "context_length_exceeded")
    assert "at most 100" in info.value.message
    with pytest.raises(RequestError) as info:
        fit_max_tokens(200, 1, False, 200)
    assert info.value.param == "messages"


# --- image dimensions -------------------------------------------------------------------------------


@pytest.mark.parametrize("size, fragment", [
    ((1, 201), "at least 2"),
    ((300, 1), "at least 2"),
    ((2, 401), "aspect ratio"),
    ((8000, 8000), "over the limit of"),
])
def test_dimensions_refused(size, fragment):
    with pytest.raises(RequestError) as info:
        check_dimensions(*size, ImageLimits())
    assert fragment in info.value.message


@pytest.mark.parametrize("size", [(2, 2), (4, 800), (7680, 4320)])
def test_dimensions_accepted(size):
    check_dimensions(*size, ImageLimits())


def _encoded(size, fmt: str) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (10, 20, 30)).save(out, format=fmt)
    return out.getvalue()


def test_a_thin_image_is_refused_before_decoding():
    with pytest.raises(RequestError, match="at least 2"):
        decode_image(_encoded((1, 50), "PNG"), ImageLimits())


def test_formats_are_configurable():
    only_png = ImageLimits(formats=("PNG",))
    assert decode_image(_encoded((4, 4), "PNG"), only_png).size == (4, 4)
    with pytest.raises(RequestError, match="supported: PNG"):
        decode_image(_encoded((4, 4), "JPEG"), only_png)


@pytest.mark.parametrize("kwargs", [{"formats": ("NOPE",)}, {"formats": ()}, {"min_side": 0},
                                    {"max_aspect_ratio": 0.5}])
def test_bad_image_limits(kwargs):
    with pytest.raises(ValueError):
        ImageLimits(**kwargs)


# --- the CPU pool -----------------------------------------------------------------------------------


def test_offload_runs_off_the_event_loop_thread():
    async def main():
        pool = Offload(2)
        loop_thread = threading.get_ident()
        worker_thread = await pool.run(threading.get_ident)
        with pytest.raises(ZeroDivisionError):
            await pool.run(lambda: 1 / 0)
        pool.close()
        return loop_thread, worker_thread, await asyncio.sleep(0, "ok")

    loop_thread, worker_thread, _ = asyncio.run(main())
    assert loop_thread != worker_thread


def test_offload_needs_a_thread():
    with pytest.raises(ValueError):
        Offload(0)


# --- flags ------------------------------------------------------------------------------------------


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_limit_arguments(parser)
    return parser.parse_args(argv)


def test_flag_defaults_match_the_limits():
    args = _args([])
    assert image_limits(args) == ImageLimits()
    assert request_limits(args).max_images == 8
    assert args.max_body_bytes == 32 * 1024 * 1024


def test_flags_and_environment(monkeypatch):
    monkeypatch.setenv("EPD_MAX_BODY_BYTES", "1234")
    monkeypatch.setenv("EPD_IMAGE_FORMATS", "png, jpeg")
    args = _args(["--max-images", "3", "--min-image-side", "5"])
    assert args.max_body_bytes == 1234
    limits = image_limits(args)
    assert (limits.formats, limits.min_side) == (("PNG", "JPEG"), 5)
    assert request_limits(args).max_images == 3


def test_bad_flags():
    with pytest.raises(ValueError):
        request_limits(_args(["--max-body-bytes", "0"]))
    with pytest.raises(ValueError):
        image_limits(_args(["--image-formats", "png,exe"]))


@pytest.mark.parametrize("side", [30000, 9000])
def test_a_png_claiming_a_huge_size_is_refused_before_any_pixel_is_decoded(side, monkeypatch):
    from PIL import ImageFile

    loads = []
    real_load = ImageFile.ImageFile.load

    def load(self):  # where Pillow allocates the pixels
        loads.append(self.size)
        return real_load(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", load)
    with pytest.raises(RequestError, match="pixels"):
        decode_image(png_claiming(side, side), ImageLimits())
    assert loads == []
    assert decode_image(png_claiming(4, 4), ImageLimits()).size == (4, 4)
    assert loads and set(loads) == {(4, 4)}  # the same file, small, is decoded: the probe works
