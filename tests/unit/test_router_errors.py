"""router/errors.py: gRPC status to HTTP status and OpenAI error type, error bodies."""

from __future__ import annotations

import grpc
import pytest

from router.errors import RequestError, error_body, http_status_for

# --- gRPC status mapping (router/errors.py), used on the same error path ---------------------------


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, (400, "invalid_request_error")),
        (grpc.StatusCode.NOT_FOUND, (404, "not_found_error")),
        (grpc.StatusCode.ABORTED, (503, "service_unavailable")),  # a failed transfer: retry the request
        (grpc.StatusCode.RESOURCE_EXHAUSTED, (429, "rate_limit_error")),
        (grpc.StatusCode.UNAVAILABLE, (503, "service_unavailable")),
        (grpc.StatusCode.DEADLINE_EXCEEDED, (504, "timeout")),
        (grpc.StatusCode.CANCELLED, (499, "cancelled")),
        (grpc.StatusCode.INTERNAL, (500, "internal_error")),
        (grpc.StatusCode.UNKNOWN, (500, "internal_error")),
        (grpc.StatusCode.FAILED_PRECONDITION, (500, "internal_error")),
    ],
)
def test_http_status_for_grpc_codes(code, expected):
    assert http_status_for(code) == expected


def test_error_body_and_request_error_defaults():
    assert error_body("slow down", "rate_limit_error", code="busy") == {
        "error": {"message": "slow down", "type": "rate_limit_error", "param": None, "code": "busy"}
    }
    error = RequestError("nope", status=404, type="not_found_error", param="model")
    assert (error.message, error.status, error.type, error.param, error.code) == ("nope", 404, "not_found_error",
                                                                                  "model", None)
    assert str(error) == "nope"
