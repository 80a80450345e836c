"""One place that turns domain exceptions into gRPC status codes, as a server interceptor.

Servicers stay thin: they raise `InvalidInput` (or let a queue / lease table / transfer error
through) and this interceptor aborts the call with the matching code and the exception's message.
"""

from __future__ import annotations

import logging

import grpc

log = logging.getLogger(__name__)


class InvalidInput(ValueError):
    """The request itself is wrong; the message says what to change."""


class Overloaded(RuntimeError):
    """A bounded queue or table is full; the caller may retry elsewhere or later."""


class Cancelled(RuntimeError):
    """The caller went away; the work was dropped (nobody reads the answer)."""


def status_for(exc: BaseException) -> grpc.StatusCode:
    from epd.batcher import QueueFull
    from epd.transfer.errors import TransferError
    from epd.transfer.leases import LeaseTableFull

    if isinstance(exc, TransferError):
        return transfer_status(exc)
    if isinstance(exc, InvalidInput):  # only what the request got wrong; a stray ValueError is our bug
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, Overloaded | QueueFull | LeaseTableFull):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    if isinstance(exc, TimeoutError):
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if isinstance(exc, Cancelled):
        return grpc.StatusCode.CANCELLED
    return grpc.StatusCode.INTERNAL


# Trailing metadata naming the peer whose failure this is (the owner of a transfer that failed), so
# the router marks that peer failed, not the healthy worker that reported it.
FAILED_PEER_KEY = "epd-failed-peer"


def transfer_status(exc) -> grpc.StatusCode:
    """How a puller reports a transfer that failed: the request can be retried (ABORTED), not "not found".

    The owner died (UNAVAILABLE), its lease expired (NOT_FOUND) or the pull ran out of time or bytes:
    the request is fine, the data it needed is gone. Only a handle inconsistent with its metadata
    is the caller's error.
    """
    if exc.code == grpc.StatusCode.INVALID_ARGUMENT:
        return grpc.StatusCode.INVALID_ARGUMENT
    if exc.code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return grpc.StatusCode.ABORTED


def failed_peer(exc: BaseException) -> str:
    """The address to blame instead of this worker, or "" (only a transfer whose owner is unreachable)."""
    from epd.transfer.errors import TransferError

    if isinstance(exc, TransferError) and exc.code == grpc.StatusCode.UNAVAILABLE:
        return exc.owner_address
    return ""


class ErrorMappingInterceptor(grpc.ServerInterceptor):
    """Wraps unary-unary and unary-stream handlers so that exceptions become status codes, and counts
    each finished call of the role's own services in `epd_requests_total{role, status}`."""

    def __init__(self, role: str = "", counted_prefix: str = "/epd.v1.") -> None:
        self.role = role
        self.counted_prefix = counted_prefix  # health checks and other services are not requests

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        count = self._counter(method)
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=_wrap_unary(handler.unary_unary, method, count))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=_wrap_stream(handler.unary_stream, method, count))
        return handler

    def _counter(self, method: str):
        if not self.role or not method.startswith(self.counted_prefix) or "/epd.v1.Transfer/" in method:
            return lambda status: None
        from epd import metrics

        return lambda status: metrics.REQUESTS.labels(self.role, status).inc()


def _abort(context: grpc.ServicerContext, exc: Exception, method: str, count):
    code = status_for(exc)
    if code == grpc.StatusCode.INTERNAL:
        log.exception("%s failed", method)
    count(code.name.lower())
    peer = failed_peer(exc)
    if peer:
        context.set_trailing_metadata(((FAILED_PEER_KEY, peer),))
    context.abort(code, str(exc) or type(exc).__name__)


def _aborted(context, count) -> None:
    code = context.code()
    count(code.name.lower() if code is not None else "error")


def _wrap_unary(behavior, method: str, count):
    def wrapped(request, context):
        try:
            reply = behavior(request, context)
        except Exception as exc:  # grpc's own abort raises a plain Exception too: re-raise that untouched
            if _is_abort(exc, context):
                _aborted(context, count)
                raise
            _abort(context, exc, method, count)
        count("ok")
        return reply

    return wrapped


def _wrap_stream(behavior, method: str, count):
    def wrapped(request, context):
        try:
            yield from behavior(request, context)
        except GeneratorExit:  # the client went away mid-stream
            count("cancelled")
            raise
        except Exception as exc:
            if _is_abort(exc, context):
                _aborted(context, count)
                raise
            _abort(context, exc, method, count)
        count("ok" if context.is_active() else "cancelled")

    return wrapped


def _is_abort(exc: Exception, context) -> bool:
    # ServicerContext.abort raises a bare Exception after setting the code; don't map it twice.
    return type(exc) is Exception and context.code() is not None
