"""One streamed chat completion against an OpenAI-compatible server, timed chunk by chunk."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from epd.bench.results import RequestResult
from epd.bench.sse import Chunk, SseParser, parse_chunk
from epd.bench.workloads import BenchRequest

_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}


def chat_body(request: BenchRequest, model: str | None, output_len: int) -> bytes:
    """The request body, serialised once before the clock starts (base64 images are large)."""
    body = {"messages": request.openai_messages(), "max_tokens": output_len, "temperature": 0,
            "ignore_eos": True,  # vLLM's extension (our gateway too): exactly `output_len` tokens
            "return_token_ids": True,  # vLLM's and ours: outputs compared with hf's id by id (epd.bench.agreement)
            "stream": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    return json.dumps(body, separators=(",", ":")).encode()


async def send_request(client: httpx.AsyncClient, url: str, body: bytes, *, index: int,
                       timeout_s: float) -> RequestResult:
    """POST `body` to `url` (…/v1/chat/completions) and time the stream; never raises for server faults."""
    timer = _StreamTimer(time.perf_counter())
    status = None
    try:
        async with asyncio.timeout(timeout_s), client.stream("POST", url, content=body, headers=_HEADERS) as reply:
            status = reply.status_code
            if status != 200:
                return timer.failed(index, status, _error_message(await reply.aread(), status))
            parser = SseParser()
            async for line in reply.aiter_lines():
                data = parser.feed(line)
                if data is not None and timer.on_chunk(parse_chunk(data)):
                    break
            else:
                tail = parser.flush()
                if tail is not None:
                    timer.on_chunk(parse_chunk(tail))
    except TimeoutError:
        return timer.failed(index, status, f"timed out after {timeout_s:g} s")
    except httpx.HTTPError as exc:
        return timer.failed(index, status, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    return timer.result(index, status)


class _StreamTimer:
    """Timestamps of token chunks, the usage chunk and the end, for one request."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.first: float | None = None
        self.last: float | None = None
        self.gaps: list[float] = []
        self.counted = 0
        self.chunk = Chunk()  # the usage / error / done facts seen so far
        self.done = False
        self.text: list[str] = []
        self.ids: list[int] = []  # empty: the server sent none

    def on_chunk(self, chunk: Chunk) -> bool:
        """Record one chunk; True when the stream is over ([DONE] or an error)."""
        now = time.perf_counter()
        if chunk.tokens:
            if self.last is None:
                self.first = now
            else:
                self.gaps.append(now - self.last)
            self.last = now
            self.counted += chunk.tokens
        self.text.append(chunk.text)
        self.ids.extend(chunk.token_ids)
        if chunk.completion_tokens is not None or chunk.error:
            self.chunk = chunk
        self.done = chunk.done
        return chunk.done or chunk.error is not None

    def result(self, index: int, status: int | None) -> RequestResult:
        e2e = time.perf_counter() - self.started
        tokens = self.chunk.completion_tokens if self.chunk.completion_tokens is not None else self.counted
        error = self.chunk.error
        if error is None and not self.done:
            error = "the stream ended without [DONE]"
        if error is None and self.first is None:
            error = "the stream carried no tokens"
        ttft = None if self.first is None else self.first - self.started
        return RequestResult(index, error is None, self.started, ttft, e2e, tuple(self.gaps), tokens,
                             self.chunk.prompt_tokens, status, error, "".join(self.text),
                             tuple(self.ids) if self.ids else None)

    def failed(self, index: int, status: int | None, error: str) -> RequestResult:
        return RequestResult(index, False, self.started, e2e_s=time.perf_counter() - self.started,
                             output_tokens=self.counted, status=status, error=error)


def _error_message(body: bytes, status: int) -> str:
    """OpenAI's `{"error": {"message": ...}}` when the server sent one, else the body's start."""
    try:
        error = json.loads(body).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError):
        message = None
    return f"HTTP {status}: {message or body[:300].decode(errors='replace')}"
