"""The chat request schema in the OpenAPI document agrees with the parser on clear cases."""

from __future__ import annotations

import jsonschema
import pytest

from router.chat_request import RequestLimits, parse_chat_request
from router.errors import RequestError
from router.openapi_schema import chat_request_schema, openapi_extra

LIMITS = RequestLimits(max_tokens_limit=64)
SCHEMA = chat_request_schema(LIMITS, "tiny")

GOOD = [
    {"messages": [{"role": "user", "content": "hi"}]},
    {"model": "tiny", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}],
     "max_tokens": 64, "temperature": 0, "top_p": 1, "top_k": -1, "stop": ["x"], "stream": True,
     "stream_options": {"include_usage": True}, "return_token_ids": True, "n": 1},
]
BAD = [
    {},
    {"messages": []},
    {"messages": [{"role": "tool", "content": "x"}]},
    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 65},
    {"messages": [{"role": "user", "content": "hi"}], "temperature": 2.5},
    {"messages": [{"role": "user", "content": "hi"}], "top_p": 0},
    {"messages": [{"role": "user", "content": "hi"}], "n": 2},
    {"messages": [{"role": "user", "content": "hi"}], "stop": ["a"] * 5},
]


@pytest.mark.parametrize("body", GOOD)
def test_valid_by_the_schema_and_accepted(body):
    jsonschema.validate(body, SCHEMA)
    parse_chat_request(body, limits=LIMITS)


@pytest.mark.parametrize("body", BAD)
def test_invalid_by_the_schema_and_refused(body):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, SCHEMA)
    with pytest.raises(RequestError):
        parse_chat_request(body, limits=LIMITS)


def test_the_operation_documents_the_body_and_the_errors():
    extra = openapi_extra(LIMITS, "tiny")
    assert extra["requestBody"]["content"]["application/json"]["schema"] == SCHEMA
    assert {"400", "401", "413", "429"} <= extra["responses"].keys()
