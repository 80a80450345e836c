"""status_for's table, and ErrorMappingInterceptor on a real gRPC server: what a client sees for each error."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from epd.batcher import QueueFull
from epd.rpc_errors import FAILED_PEER_KEY, Cancelled, ErrorMappingInterceptor, InvalidInput, Overloaded, status_for
from epd.transfer.errors import TransferError
from epd.transfer.leases import LeaseTableFull

Code = grpc.StatusCode


# --- status_for --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("exc, code", [
    (InvalidInput("bad"), Code.INVALID_ARGUMENT),
    (ValueError("bad"), Code.INTERNAL),  # a stray ValueError is a fault of ours, not the caller's input
    (Cancelled("gone"), Code.CANCELLED),
    (Overloaded("full"), Code.RESOURCE_EXHAUSTED),
    (QueueFull("full"), Code.RESOURCE_EXHAUSTED),
    (LeaseTableFull("full"), Code.RESOURCE_EXHAUSTED),
    (TimeoutError("late"), Code.DEADLINE_EXCEEDED),
    (RuntimeError("boom"), Code.INTERNAL),
    (KeyError("k"), Code.INTERNAL),
    (Exception("plain"), Code.INTERNAL),
])
def test_status_for(exc, code):
    assert status_for(exc) is code


@pytest.mark.parametrize("code, reported", [
    (Code.NOT_FOUND, Code.ABORTED),  # an expired lease: the request is fine, retry it (never "not found")
    (Code.UNAVAILABLE, Code.ABORTED),  # the owner died: the puller is healthy
    (Code.DATA_LOSS, Code.ABORTED),
    (Code.DEADLINE_EXCEEDED, Code.DEADLINE_EXCEEDED),
    (Code.INVALID_ARGUMENT, Code.INVALID_ARGUMENT),  # handle and metadata disagree: the caller's error
])
def test_a_failed_transfer_is_reported_as_retryable_not_as_the_owners_status(code, reported):
    assert status_for(TransferError(code, "gone", handle_id="h1", owner_address="10.0.0.1:5")) is reported


def test_transfer_error_message_names_handle_and_owner():
    exc = TransferError(Code.NOT_FOUND, "lease expired", handle_id="h1", owner_address="")
    assert str(exc) == "lease expired (transfer handle 'h1' owned by <no address>)"
    assert (exc.handle_id, exc.owner_address) == ("h1", "")


def test_invalid_input_is_a_value_error_and_overloaded_a_runtime_error():
    assert issubclass(InvalidInput, ValueError)
    assert issubclass(Overloaded, RuntimeError)


# --- the interceptor on a real server ------------------------------------------------------------------------


def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
    what = request.decode()
    if what == "ok":
        return b"fine"
    if what == "invalid":
        raise InvalidInput("max_tokens must be >= 1, got 0")
    if what == "overloaded":
        raise Overloaded("8 requests already wait for the model; try again later")
    if what == "boom":
        raise RuntimeError("kaput")
    if what == "empty":
        raise RuntimeError()
    if what == "timeout":
        raise TimeoutError("waited 1.0 s for the model without getting a turn")
    if what == "transfer":
        raise TransferError(Code.DATA_LOSS, "short read", handle_id="h9", owner_address="o:1")
    if what == "owner-died":
        raise TransferError(Code.UNAVAILABLE, "pull failed", handle_id="h9", owner_address="10.0.0.7:5")
    if what == "bug":
        raise ValueError("too many values to unpack")
    if what == "abort":
        context.abort(Code.NOT_FOUND, "no such handle")
    raise AssertionError(what)


def stream(request: bytes, context: grpc.ServicerContext):
    yield b"first"
    what = request.decode()
    if what == "ok":
        yield b"second"
        return
    if what == "invalid":
        raise InvalidInput("bad stop token")
    if what == "overloaded":
        raise QueueFull("queue full")
    if what == "boom":
        raise RuntimeError("kaput")
    if what == "abort":
        context.abort(Code.NOT_FOUND, "no such handle")
    raise AssertionError(what)


COUNTED_ROLE = "unit-rpc-errors"


def identity(x: bytes) -> bytes:
    return x


@pytest.fixture(scope="module")
def channel():
    handler = grpc.method_handlers_generic_handler("t.S", {
        "M": grpc.unary_unary_rpc_method_handler(unary, request_deserializer=identity, response_serializer=identity),
        "Stream": grpc.unary_stream_rpc_method_handler(stream, request_deserializer=identity,
                                                       response_serializer=identity),
    })
    server = grpc.server(ThreadPoolExecutor(max_workers=4), handlers=[handler],
                         interceptors=[ErrorMappingInterceptor(COUNTED_ROLE, counted_prefix="/t.")])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    chan = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield chan
    finally:
        chan.close()
        server.stop(0)


def call_unary(channel, what: str) -> grpc.RpcError:
    method = channel.unary_unary("/t.S/M", request_serializer=identity, response_deserializer=identity)
    with pytest.raises(grpc.RpcError) as info:
        method(what.encode(), timeout=5)
    return info.value


def call_stream(channel, what: str) -> tuple[list[bytes], grpc.RpcError | None]:
    method = channel.unary_stream("/t.S/Stream", request_serializer=identity, response_deserializer=identity)
    got: list[bytes] = []
    try:
        for item in method(what.encode(), timeout=5):
            got.append(item)
    except grpc.RpcError as exc:
        return got, exc
    return got, None


def test_unary_success_passes_through(channel):
    method = channel.unary_unary("/t.S/M", request_serializer=identity, response_deserializer=identity)
    assert method(b"ok", timeout=5) == b"fine"


@pytest.mark.parametrize("what, code, details", [
    ("invalid", Code.INVALID_ARGUMENT, "max_tokens must be >= 1, got 0"),
    ("overloaded", Code.RESOURCE_EXHAUSTED, "8 requests already wait for the model; try again later"),
    ("boom", Code.INTERNAL, "kaput"),
    ("empty", Code.INTERNAL, "RuntimeError"),  # no message: the type's name, never an empty status
    ("timeout", Code.DEADLINE_EXCEEDED, "waited 1.0 s for the model without getting a turn"),
    ("transfer", Code.ABORTED, "short read (transfer handle 'h9' owned by o:1)"),
    ("bug", Code.INTERNAL, "too many values to unpack"),
    ("abort", Code.NOT_FOUND, "no such handle"),  # the servicer's own abort is left untouched
])
def test_unary_error_becomes_status(channel, what, code, details):
    error = call_unary(channel, what)
    assert (error.code(), error.details()) == (code, details)


def test_a_transfer_whose_owner_died_names_the_owner_in_the_trailers(channel):
    error = call_unary(channel, "owner-died")
    assert error.code() is Code.ABORTED
    assert dict(error.trailing_metadata())[FAILED_PEER_KEY] == "10.0.0.7:5"
    assert FAILED_PEER_KEY not in dict(call_unary(channel, "transfer").trailing_metadata() or ())


def test_stream_success_passes_through(channel):
    assert call_stream(channel, "ok") == ([b"first", b"second"], None)


@pytest.mark.parametrize("what, code, details", [
    ("invalid", Code.INVALID_ARGUMENT, "bad stop token"),
    ("overloaded", Code.RESOURCE_EXHAUSTED, "queue full"),
    ("boom", Code.INTERNAL, "kaput"),
    ("abort", Code.NOT_FOUND, "no such handle"),
])
def test_stream_error_after_one_item_becomes_status(channel, what, code, details):
    got, error = call_stream(channel, what)
    assert got == [b"first"]
    assert error is not None
    assert (error.code(), error.details()) == (code, details)


def test_internal_errors_are_logged_and_client_errors_are_not(channel, caplog):
    with caplog.at_level("ERROR", logger="epd.rpc_errors"):
        call_unary(channel, "invalid")
        assert [r for r in caplog.records if r.name == "epd.rpc_errors"] == []
        call_unary(channel, "boom")
    logged = [r for r in caplog.records if r.name == "epd.rpc_errors"]
    assert [r.getMessage() for r in logged] == ["/t.S/M failed"]
    assert logged[0].exc_info is not None


def test_unknown_method_is_unimplemented(channel):
    method = channel.unary_unary("/t.S/Nope", request_serializer=identity, response_deserializer=identity)
    with pytest.raises(grpc.RpcError) as info:
        method(b"", timeout=5)
    assert info.value.code() is Code.UNIMPLEMENTED


def _count(status: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("epd_requests_total", {"role": COUNTED_ROLE, "status": status}) or 0.0


def test_finished_calls_are_counted_by_outcome(channel):
    before = {s: _count(s) for s in ("ok", "invalid_argument", "resource_exhausted", "not_found")}
    call_stream(channel, "ok")
    call_unary(channel, "invalid")
    call_stream(channel, "overloaded")
    call_unary(channel, "abort")
    after = {s: _count(s) for s in before}
    assert {s: after[s] - before[s] for s in before} == {"ok": 1, "invalid_argument": 1, "resource_exhausted": 1,
                                                          "not_found": 1}


def test_health_and_transfer_calls_are_not_counted():
    from prometheus_client import REGISTRY

    role = "unit-not-counted"
    interceptor = ErrorMappingInterceptor(role)
    for method in ("/grpc.health.v1.Health/Check", "/epd.v1.Transfer/Pull", "/epd.v1.Encoder/Encode"):
        interceptor._counter(method)("ok")
    assert REGISTRY.get_sample_value("epd_requests_total", {"role": role, "status": "ok"}) == 1.0
