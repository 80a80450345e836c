"""What the gateway refuses before looking inside a request: oversized bodies, unparseable or
pathologically nested JSON, and prompts that cannot fit the model's context.

Each refusal is a `RequestError` (4xx with an OpenAI error body), never a 500.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from router.errors import RequestError

# Base64 makes a 20 MB image 26.7 MB; this admits one such image or several ordinary ones.
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
# A client trickling its body holds an admission slot meanwhile; 32 MiB at 10 Mbit/s is 27 s.
DEFAULT_BODY_TIMEOUT_S = 60.0


async def read_body_capped(chunks: AsyncIterator[bytes], content_length: str | None, max_bytes: int,
                           timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> bytes:
    """The whole body, refused with 413 as soon as it is known to pass `max_bytes`, 408 if it takes
    longer than `timeout_s` to arrive.

    A declared Content-Length over the limit is refused before a byte is read; a chunked body is
    counted as it arrives, so at most `max_bytes` plus one chunk is ever held.
    """
    if content_length is not None and content_length.strip().isdigit() and int(content_length) > max_bytes:
        raise _too_large(int(content_length), max_bytes)
    parts: list[bytes] = []
    total = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in chunks:
                total += len(chunk)
                if total > max_bytes:
                    raise _too_large(None, max_bytes)
                parts.append(chunk)
    except TimeoutError:
        raise RequestError(f"the request body did not arrive within {timeout_s:g} s", status=408,
                           code="request_timeout") from None
    return b"".join(parts)


def _too_large(size: int | None, max_bytes: int) -> RequestError:
    what = f"{size} bytes" if size is not None else "larger than that"
    return RequestError(f"the request body is {what}; this server accepts at most {max_bytes} bytes",
                        status=413, code="request_too_large")


def parse_json_body(raw: bytes) -> object:
    """The decoded JSON body; any way it can fail to parse is a 400.

    CPU work (hundreds of ms for a 30 MB body): run it off the event loop.
    """
    if not raw.strip():
        raise RequestError("the request body is empty; send a JSON object")
    try:
        return json.loads(raw)
    except RecursionError:
        # json's C scanner recurses once per nesting level and gives up near the interpreter's limit.
        raise RequestError("the request body is nested too deeply to parse") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of > 4300 digits
        raise RequestError(f"the request body is not valid JSON: {str(exc)[:200]}") from None


def context_length(config) -> int | None:
    """The model's context window from its (multimodal) config: the text model's positions."""
    for part in (getattr(config, "text_config", None), config):
        value = getattr(part, "max_position_embeddings", None) if part is not None else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def fit_max_tokens(prompt_tokens: int, max_tokens: int, given: bool, context: int | None) -> int:
    """`max_tokens` if prompt + completion fits the context; a defaulted one shrinks to fit.

    Counts the prompt's text tokens: image tokens are known only once an encoder has run, and the
    engine stops a sequence at the context either way (finish reason "length").
    """
    if context is None or prompt_tokens + max_tokens <= context:
        return max_tokens
    room = context - prompt_tokens
    if room < 1:
        raise RequestError(f"the prompt has {prompt_tokens} tokens, which leaves no room in the model's context of "
                           f"{context} tokens", param="messages", code="context_length_exceeded")
    if not given:
        return room
    raise RequestError(f"the prompt ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) is over the model's "
                       f"context of {context} tokens; ask for at most {room}", param="max_tokens",
                       code="context_length_exceeded")
