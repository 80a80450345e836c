"""OpenAI response shapes: usage, the non-streaming body (with and without token ids), stream and usage chunks."""

from __future__ import annotations

import time
from types import SimpleNamespace

from router import openai_format
from router.completion import Final
from router.openai_format import chunk, completion_body, usage, usage_chunk

FINAL = Final(finish_reason="length", prompt_tokens=12, completion_tokens=5)


def test_usage_totals():
    assert usage(FINAL) == {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}


def test_usage_of_nothing_is_zeros():
    assert usage(Final("stop", 0, 0)) == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}


def test_completion_body_without_token_ids(monkeypatch):
    monkeypatch.setattr(openai_format, "time", SimpleNamespace(time=lambda: 1_700_000_123.9))
    body = completion_body("chatcmpl-1", "tiny", "Hello there", [5, 6, 7], FINAL, None)
    assert body == {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1_700_000_123, "model": "tiny",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there"},
                     "finish_reason": "length", "logprobs": None}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
    }


def test_completion_body_with_token_ids(monkeypatch):
    monkeypatch.setattr(openai_format, "time", SimpleNamespace(time=lambda: 1_700_000_000.0))
    body = completion_body("chatcmpl-2", "tiny", "Hi", [5, 6], Final("stop", 3, 2), [1, 2, 3])
    assert body == {
        "id": "chatcmpl-2", "object": "chat.completion", "created": 1_700_000_000, "model": "tiny",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop",
                     "logprobs": None, "token_ids": [5, 6]}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        "prompt_token_ids": [1, 2, 3],
    }


def test_completion_body_with_empty_prompt_ids_still_carries_token_ids():
    body = completion_body("r", "m", "", [], Final("stop", 0, 0), [])
    assert body["prompt_token_ids"] == []
    assert body["choices"][0]["token_ids"] == []


def test_completion_body_created_is_an_int_of_now():
    before = int(time.time())
    created = completion_body("r", "m", "", [], FINAL, None)["created"]
    assert isinstance(created, int) and before <= created <= int(time.time())


def test_role_chunk():
    assert chunk("r", "m", 77, {"role": "assistant", "content": ""}) == {
        "id": "r", "object": "chat.completion.chunk", "created": 77, "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None,
                     "logprobs": None}],
    }


def test_content_chunk_with_token_ids_on_the_choice_as_vllm():
    delta = {"content": "lo"}
    assert chunk("r", "m", 77, delta, token_ids=[9, 10]) == {
        "id": "r", "object": "chat.completion.chunk", "created": 77, "model": "m",
        "choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": None, "logprobs": None,
                     "token_ids": [9, 10]}],
    }
    assert delta == {"content": "lo"}  # the caller's dict is not modified


def test_first_chunk_carries_the_prompt_token_ids():
    first = chunk("r", "m", 77, {"role": "assistant", "content": ""}, prompt_token_ids=[1, 2, 3])
    assert first["prompt_token_ids"] == [1, 2, 3]
    assert "token_ids" not in first["choices"][0]
    assert "prompt_token_ids" not in chunk("r", "m", 77, {"content": "x"}, token_ids=[4])


def test_content_chunk_with_empty_token_ids_keeps_the_key():
    choice = chunk("r", "m", 1, {"content": ""}, token_ids=[])["choices"][0]
    assert (choice["delta"], choice["token_ids"]) == ({"content": ""}, [])


def test_content_chunk_without_token_ids_has_no_key():
    body = chunk("r", "m", 1, {"content": "x"})
    assert body["choices"][0]["delta"] == {"content": "x"}
    assert "token_ids" not in body["choices"][0] and "prompt_token_ids" not in body


def test_finish_chunk():
    assert chunk("r", "m", 77, {}, finish_reason="stop") == {
        "id": "r", "object": "chat.completion.chunk", "created": 77, "model": "m",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "logprobs": None}],
    }


def test_usage_chunk_has_empty_choices():
    assert usage_chunk("r", "m", 77, FINAL) == {
        "id": "r", "object": "chat.completion.chunk", "created": 77, "model": "m", "choices": [],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
    }
