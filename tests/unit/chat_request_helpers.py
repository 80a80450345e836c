"""Shared helpers of the parse_chat_request tests."""

from __future__ import annotations

import pytest

from router.chat_request import ChatRequest, RequestLimits, parse_chat_request
from router.errors import RequestError

LIMITS = RequestLimits()
PNG = "data:image/png;base64,iVBORw0KGgo="


def parse(body: object, limits: RequestLimits = LIMITS) -> ChatRequest:
    return parse_chat_request(body, limits=limits)


def user(content: object) -> dict:
    return {"messages": [{"role": "user", "content": content}]}


def refused(body: object, limits: RequestLimits = LIMITS) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse(body, limits)
    assert info.value.status == 400
    assert info.value.type == "invalid_request_error"
    return info.value


def assert_refused(body: object, param: str | None, fragment: str, limits: RequestLimits = LIMITS) -> None:
    error = refused(body, limits)
    assert error.param == param, error
    assert fragment in error.message, error.message
