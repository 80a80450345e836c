"""Errors the router reports to clients, in the OpenAI shape, and the gRPC → HTTP status mapping.

One table decides what a worker's gRPC status means to an HTTP client, so the gateway and the
streaming path cannot drift apart (DESIGN.md, "Wire contract").
"""

from __future__ import annotations

import grpc

INVALID_REQUEST = "invalid_request_error"
INTERNAL = "internal_error"


class RequestError(Exception):
    """A request the router refuses, carrying everything the OpenAI error body needs.

    Raised by pure parsing / loading code so that it never has to know about HTTP frameworks;
    the gateway turns it into a response with `error_body`.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        type: str = INVALID_REQUEST,  # shadows the builtin: the OpenAI field is called "type"
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        """The OpenAI error body for this error."""
        return error_body(self.message, self.type, self.param, self.code)

    def __repr__(self) -> str:
        return f"RequestError({self.message!r}, status={self.status}, type={self.type!r}, param={self.param!r})"


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    """`{"error": {...}}` exactly as OpenAI's API answers, so official clients parse it."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# What a worker's status means to an HTTP client. 499 is nginx's "client closed request": a
# CANCELLED call is almost always the client going away, and it must not count as a server error.
_GRPC_TO_HTTP: dict[grpc.StatusCode, tuple[int, str]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, INVALID_REQUEST),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "service_unavailable"),
    # A transfer failed (its owner died, its lease expired): the request is fine, retrying it is not.
    grpc.StatusCode.ABORTED: (503, "service_unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout"),
    grpc.StatusCode.CANCELLED: (499, "cancelled"),
}


def http_status_for(code: grpc.StatusCode) -> tuple[int, str]:
    """(HTTP status, OpenAI error type) for a gRPC status; anything unlisted is the server's fault."""
    return _GRPC_TO_HTTP.get(code, (500, INTERNAL))
