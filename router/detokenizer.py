"""Streaming text out of streamed token ids: incremental detokenization and stop strings.

Both pieces hold text back rather than ever take it back: a streamed chunk cannot be recalled, so
text is released only once no later token can change it (a multi-byte character still incomplete)
or turn it into a stop string (a tail that is the start of one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_REPLACEMENT = "\ufffd"  # what a byte-level decoder shows for an incomplete UTF-8 sequence


class IncrementalDetokenizer:
    """Text for one request's generated ids, chunk by chunk, equal in sum to one full decode.

    vLLM's prefix-offset scheme: each push decodes only a short window that starts at the last
    chunk's ids (the "prefix"), and emits what the new ids add to it. The prefix supplies the
    context a decoder needs to render a token as it appears mid-text (a SentencePiece token's
    leading space, the first bytes of a character split across tokens), so a push costs
    O(window), not O(generated so far). Text ending in U+FFFD is held: the next ids may complete
    the character, and a streamed "?" could not be taken back.
    """

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0  # window start: ids kept only as decoding context
        self._read_offset = 0  # ids before this one have been emitted as text

    @property
    def token_ids(self) -> list[int]:
        """Every id pushed so far (a copy)."""
        return list(self._ids)

    def push(self, token_ids: Sequence[int]) -> str:
        """Append ids; the text that is now final (possibly empty)."""
        self._ids.extend(int(t) for t in token_ids)
        prefix_text, new_text = self._window()
        # Nothing new (special tokens skipped), or a character is still being spelled out in
        # bytes. The window keeps growing until it completes; max_tokens bounds it.
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """Whatever is still held at the end of the request, incomplete characters included."""
        prefix_text, new_text = self._window()
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def _window(self) -> tuple[str, str]:
        """(text of the prefix ids, text of the prefix ids plus every unread id)."""
        if self._read_offset == len(self._ids):
            return "", ""
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        return prefix, full

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)


class StopMatcher:
    """Cuts streamed text at the first stop string, which itself is not emitted (as OpenAI does).

    A tail that could be the start of a stop string is held back until the next chunk settles
    it, so a stop string split across chunks ("…\\n\\nUs" + "er:") is still caught. After a
    match every feed returns ("", True).
    """

    def __init__(self, stops: Sequence[str]) -> None:
        if any(not isinstance(s, str) or not s for s in stops):
            raise ValueError(f"stop strings must be non-empty strings, got {list(stops)!r}")
        self._stops = tuple(stops)
        # The longest tail worth holding: one character short of the longest stop string.
        self._max_held = max((len(s) for s in self._stops), default=1) - 1
        self._held = ""
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def feed(self, text: str) -> tuple[str, bool]:
        """(text safe to emit now, whether a stop string was reached)."""
        if self._stopped:
            return "", True
        if not self._stops:
            return text, False
        # Only the held tail can start a match that runs into the new text; earlier text cannot.
        buffer = self._held + text
        cut = min((i for i in (buffer.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self._stopped, self._held = True, ""
            return buffer[:cut], True
        keep = self._partial_stop_length(buffer)
        self._held = buffer[len(buffer) - keep :]
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """The held tail, at the end of the request (it never completed a stop string)."""
        held, self._held = self._held, ""
        return held

    def _partial_stop_length(self, buffer: str) -> int:
        """Length of the longest tail of `buffer` that is a proper prefix of some stop string."""
        for length in range(min(len(buffer), self._max_held), 0, -1):
            tail = buffer[-length:]
            if any(stop.startswith(tail) for stop in self._stops):
                return length
        return 0
