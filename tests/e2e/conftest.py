"""Shared pieces of the end-to-end tests: checkpoints, images, references, a loopback image server."""

from __future__ import annotations

import base64
import io
import threading
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from epd.tiny.writer import make_tiny_model
from tests.e2e.cluster import Processes
from tests.model.conftest import reference_generate

QUESTION = "What is in this picture?"


@pytest.fixture(scope="session")
def e2e_dirs(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("e2e_models")
    return {fam: str(make_tiny_model(fam, "tiny", root / fam, seed=11)) for fam in ("kimi_k25", "qwen3_vl_moe")}


def pattern_image(index: int) -> Image.Image:
    """A distinct image per index: size, colours and stripes all vary."""
    width, height = 48 + 8 * (index % 5), 40 + 12 * (index % 4)
    image = Image.new("RGB", (width, height), ((37 * index) % 256, (91 * index + 40) % 256, (53 * index + 90) % 256))
    for x in range(0, width, 6 + index % 3):
        image.paste(((200 + index) % 256, 30, (17 * index) % 256), (x, 0, x + 3, height))
    return image


def png_bytes(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def data_url(image: Image.Image) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode()


def openai_messages(image_urls: list[str], text: str = QUESTION, system: str | None = None) -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in image_urls] + [{"type": "text", "text": text}]
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": parts}]


@cache
def reference(model_dir: str, image_indices: tuple[int, ...], max_tokens: int, text: str = QUESTION,
              system: str | None = None) -> tuple[list[int], str]:
    """transformers generate's greedy ids and text for the same conversation, images by index."""
    from transformers import AutoTokenizer

    parts = [{"type": "image", "image": pattern_image(i)} for i in image_indices] + [{"type": "text", "text": text}]
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": parts}]
    ids, _ = reference_generate(model_dir, messages, max_tokens)
    text_out = AutoTokenizer.from_pretrained(model_dir).decode(ids, skip_special_tokens=True)
    return ids, text_out


def assert_one_image_answer_is_the_reference(base_url: str, family: str, model_dir: str, max_tokens: int) -> None:
    """The openai client's greedy answer about pattern image 1 equals transformers', ids and text."""
    import openai

    expected_ids, expected_text = reference(model_dir, (1,), max_tokens)
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model=family, messages=openai_messages([data_url(pattern_image(1))]), max_tokens=max_tokens,
        temperature=0, extra_body={"return_token_ids": True})
    assert (reply.choices[0].model_extra or {}).get("token_ids") == expected_ids
    assert reply.choices[0].message.content == expected_text


class _Images(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # /img/<index>.png
        try:
            index = int(self.path.removeprefix("/img/").removesuffix(".png"))
        except ValueError:
            self.send_error(404)
            return
        body = png_bytes(pattern_image(index))
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="session")
def image_server() -> str:
    """Base URL (http://127.0.0.1:PORT) of a loopback server for /img/<index>.png."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def processes(tmp_path):
    """Start single services with `processes.start(name, role, ...)`; all are stopped after the test."""
    procs = Processes(tmp_path)
    yield procs
    procs.stop_all()
