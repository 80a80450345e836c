"""release_if_undelivered on a real gRPC server on loopback: a reply the caller received keeps its
leases; a call the caller cancelled frees them, whether the cancel came before or after the handler
registered the release. These also pin the grpc internals `call_cancelled` reads."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest

from epd.transfer.undelivered import call_cancelled, release_if_undelivered

_WAIT_S = 10.0


class Handler:
    """One unary method whose behaviour each test sets; records what happened to its 'lease'."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.ended = threading.Event()  # gRPC ran the call's termination callbacks
        self.registered = threading.Event()
        self.go = threading.Event()
        self.wait_for_cancel_first = False
        self.cancelled_at_end: bool | None = None
        self.cancelled_at_start: bool | None = None

    def __call__(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self.cancelled_at_start = call_cancelled(context)
        context.add_callback(self._on_end(context))
        if self.wait_for_cancel_first:
            deadline = time.monotonic() + _WAIT_S
            while context.is_active() and time.monotonic() < deadline:
                time.sleep(0.005)
        release_if_undelivered(context, self, ["handle"])
        self.registered.set()
        self.go.wait(_WAIT_S)
        return b"handle"

    def release(self, handle_id: str) -> bool:  # as the worker's TransferSender
        assert handle_id == "handle"
        self.released.set()
        return True

    def _on_end(self, context: grpc.ServicerContext):
        def ended() -> None:
            self.cancelled_at_end = call_cancelled(context)
            self.ended.set()
        return ended


@pytest.fixture
def served():
    handler = Handler()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "t.T", {"M": grpc.unary_unary_rpc_method_handler(handler)})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield handler, channel.unary_unary("/t.T/M")
    finally:
        handler.go.set()
        channel.close()
        server.stop(grace=None)


def test_a_delivered_reply_keeps_its_leases(served):
    handler, call = served
    handler.go.set()
    assert call(b"x", timeout=_WAIT_S) == b"handle"
    assert handler.ended.wait(_WAIT_S)
    assert handler.cancelled_at_start is False
    assert handler.cancelled_at_end is False
    assert not handler.released.is_set()


def test_a_cancel_after_registering_frees_the_leases(served):
    """The race this exists for: the handler has its reply (and leases) when the caller leaves."""
    handler, call = served
    future = call.future(b"x", timeout=_WAIT_S)
    assert handler.registered.wait(_WAIT_S)
    future.cancel()
    assert handler.released.wait(_WAIT_S), "a cancelled call's leases were not released"
    handler.go.set()
    assert handler.ended.wait(_WAIT_S)
    assert handler.cancelled_at_end is True


def test_a_cancel_before_registering_frees_the_leases_at_once(served):
    handler, call = served
    handler.wait_for_cancel_first = True
    future = call.future(b"x", timeout=_WAIT_S)
    time.sleep(0.1)  # the handler is running, polling is_active()
    future.cancel()
    assert handler.registered.wait(_WAIT_S)
    assert handler.released.is_set(), "the call had ended: the release should run on the handler's thread"

