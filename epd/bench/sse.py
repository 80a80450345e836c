"""Reading an OpenAI chat-completion stream: SSE lines -> events -> what each chunk means (pure)."""

from __future__ import annotations

import json
from dataclasses import dataclass


class SseParser:
    """Server-sent events from lines: `data:` fields accumulate, a blank line ends the event."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        """The event's data when `line` completes one, else None."""
        line = line.rstrip("\r\n")
        if not line:
            return self.flush()
        if line.startswith(":"):  # a comment (keep-alive)
            return None
        field, _, value = line.partition(":")
        if field == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None  # event:, id:, retry: carry nothing a chat completion needs

    def flush(self) -> str | None:
        """An event left open when the stream ended (a server that forgot the last blank line)."""
        if not self._data:
            return None
        data, self._data = "\n".join(self._data), []
        return data


@dataclass(frozen=True)
class Chunk:
    """What one `data:` payload says, as far as timing goes, and the output it carries."""

    tokens: int = 0  # output tokens this chunk carries; 0: not a token chunk (role, finish, usage)
    text: str = ""  # the first choice's `content`
    token_ids: tuple[int, ...] = ()  # its token ids, where the server sends them (ours, vLLM's)
    completion_tokens: int | None = None  # from `usage`, normally only on the last chunk
    prompt_tokens: int | None = None
    error: str | None = None
    done: bool = False  # the `[DONE]` sentinel


def parse_chunk(data: str) -> Chunk:
    if data.strip() == "[DONE]":
        return Chunk(done=True)
    try:
        payload = json.loads(data)
    except ValueError:
        return Chunk(error=f"malformed stream chunk: {data[:200]!r}")
    if not isinstance(payload, dict):
        return Chunk(error=f"unexpected stream chunk: {data[:200]!r}")
    if "error" in payload:  # OpenAI-style error chunk sent after the stream started
        error = payload["error"]
        message = error.get("message") if isinstance(error, dict) else error
        return Chunk(error=str(message))
    usage = payload.get("usage") or {}
    choice, delta = _first_choice(payload.get("choices"))
    ids = _ids_of(choice, delta)
    content = delta.get("content")
    return Chunk(tokens=_tokens_in(choice, delta, ids), text=content if isinstance(content, str) else "",
                 token_ids=ids, completion_tokens=usage.get("completion_tokens"),
                 prompt_tokens=usage.get("prompt_tokens"))


def _first_choice(choices) -> tuple[dict, dict]:
    """(the first choice, its delta), empty dicts where the chunk has none."""
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    delta = choice.get("delta")
    return choice, delta if isinstance(delta, dict) else {}


def _ids_of(choice: dict, delta: dict) -> tuple[int, ...]:
    ids = choice.get("token_ids") or delta.get("token_ids")
    return tuple(i for i in ids if isinstance(i, int)) if isinstance(ids, list) else ()


def _tokens_in(choice: dict, delta: dict, ids: tuple[int, ...]) -> int:
    """Tokens carried by the first choice's delta.

    A chunk carries tokens when it has text, or token ids, or an empty `content` without `role`:
    our gateway sends such a chunk when the detokenizer holds a token's bytes back (a split UTF-8
    character). The opening `{"role": "assistant", "content": ""}` (ours and vLLM's) carries none.
    Servers that return `token_ids` (vLLM's shape, and ours: on the choice; older servers put them
    in the delta) get an exact count; otherwise a chunk counts as one.
    """
    if ids:
        return len(ids)
    content = delta.get("content")
    if content or delta.get("reasoning_content"):
        return 1
    # vLLM may close with `{"content": ""}` and a finish reason: that one carries nothing either.
    return 1 if content == "" and "role" not in delta and choice.get("finish_reason") is None else 0
