"""parse_chat_request: refused sampling and output fields, unsupported features, limits."""

from __future__ import annotations

import pytest

from router.chat_request import RequestLimits
from tests.unit.chat_request_helpers import assert_refused, refused, user

# --- refused: sampling and output -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("max_tokens", 1.5, "must be an integer, got number 1.5"),
        ("max_tokens", "10", "must be an integer, got string '10'"),
        ("max_tokens", True, "must be an integer, got boolean true"),
        ("max_tokens", 0, "must be at least 1, got 0"),
        ("max_tokens", 4097, "'max_tokens' is 4097, over this server's limit of 4096"),
        ("max_completion_tokens", -3, "'max_completion_tokens' must be at least 1"),
        ("max_completion_tokens", 5000, "over this server's limit of 4096"),
        ("temperature", "hot", "must be a number, got string 'hot'"),
        ("temperature", 2.5, "must be between 0 and 2, got 2.5"),
        ("temperature", -0.1, "must be between 0 and 2"),
        ("temperature", float("nan"), "must be a finite number"),
        ("temperature", False, "must be a number, got boolean false"),
        ("top_p", 0, "must be greater than 0 and at most 1, got 0"),
        ("top_p", 1.01, "greater than 0 and at most 1"),
        ("top_p", [1], "must be a number, got array"),
        ("top_k", -2, "must be -1 or 0 (no limit) or a positive integer, got -2"),
        ("top_k", 2.0, "must be an integer, got number 2.0"),
        ("seed", "1", "must be an integer"),
        ("seed", 2**64, "must be a 64-bit integer"),
        ("ignore_eos", 1, "must be a boolean, got number 1"),
        ("return_token_ids", "yes", "must be a boolean"),
        ("stream", "true", "'stream' must be a boolean, got string 'true'"),
        ("model", 3, "'model' must be a string, got number 3"),
    ],
)
def test_bad_scalar_fields(key, value, fragment):
    assert_refused({**user("x"), key: value}, key, fragment)


def test_max_tokens_and_max_completion_tokens_disagree():
    body = {**user("x"), "max_tokens": 5, "max_completion_tokens": 6}
    assert_refused(body, "max_completion_tokens", "'max_tokens' (5) and 'max_completion_tokens' (6) disagree")


@pytest.mark.parametrize(
    ("stop", "fragment"),
    [
        (5, "must be a string or an array of strings, got number 5"),
        ("", "'stop[0]' must be a non-empty string"),
        (["a", ""], "'stop[1]' must be a non-empty string"),
        (["a", 3], "'stop[1]' must be a non-empty string, got number 3"),
        (["a", "b", "c", "d", "e"], "too many stop sequences: 5, this server allows at most 4"),
        (["x" * 257], "'stop[0]' is 257 characters, over the limit of 256"),
    ],
)
def test_bad_stop(stop, fragment):
    assert_refused({**user("x"), "stop": stop}, "stop", fragment)


def test_stream_options_require_stream():
    for stream in (False, None):
        body = {**user("x"), "stream_options": {"include_usage": True}}
        if stream is not None:
            body["stream"] = stream
        assert_refused(body, "stream_options", "only allowed when 'stream' is true")


def test_stream_options_types():
    assert_refused({**user("x"), "stream": True, "stream_options": []}, "stream_options", "must be an object")
    body = {**user("x"), "stream": True, "stream_options": {"include_usage": "yes"}}
    assert_refused(body, "stream_options.include_usage", "'include_usage' must be a boolean")


# --- refused: unsupported features ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("n", 2, "'n' must be 1"),
        ("n", "1", "'n' must be an integer"),
        ("logprobs", True, "logprobs are not supported"),
        ("logprobs", "no", "'logprobs' must be a boolean"),
        ("top_logprobs", 3, "logprobs are not supported"),
        ("tools", [{"type": "function", "function": {"name": "f"}}], "'tools' (tool calling) is not supported"),
        ("functions", [{"name": "f"}], "'functions' (tool calling) is not supported"),
        ("tool_choice", "auto", "'tool_choice' (tool calling) is not supported"),
        ("tool_choice", {"type": "function"}, "'tool_choice' (tool calling)"),
        ("function_call", "auto", "'function_call' (tool calling)"),
        ("response_format", {"type": "json_object"}, "only 'response_format': {\"type\": \"text\"}"),
        ("response_format", "text", "only 'response_format'"),
        ("frequency_penalty", 0.5, "'frequency_penalty' is not supported by this server; send 0 or omit it"),
        ("presence_penalty", -1, "'presence_penalty' is not supported"),
        ("presence_penalty", "0", "'presence_penalty' must be a number"),
        ("logit_bias", {"50256": -100}, "'logit_bias' is not supported"),
    ],
)
def test_unsupported_features(key, value, fragment):
    assert_refused({**user("x"), key: value}, key, fragment)


def test_long_strings_are_not_echoed():
    error = refused({**user("x"), "temperature": "h" * 10_000})
    assert len(error.message) < 120
    assert error.message == "'temperature' must be a number, got string 'hhhhhhhhhhhhhhhhhhhhhhhh'..."


def test_error_body_shape():
    error = refused({**user("x"), "n": 3})
    assert error.body() == {
        "error": {"message": "'n' must be 1 (one choice per request), got 3", "type": "invalid_request_error",
                  "param": "n", "code": None}
    }


# --- limits ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"default_max_tokens": 0}, "default_max_tokens must be >= 1"),
        ({"max_tokens_limit": 0}, "max_tokens_limit must be >= 1"),
        ({"max_images": -1}, "max_images must be >= 0"),
        ({"default_temperature": 3.0}, "default_temperature must be in [0, 2]"),
    ],
)
def test_bad_limits(fields, fragment):
    with pytest.raises(ValueError) as info:
        RequestLimits(**fields)
    assert fragment in str(info.value)
