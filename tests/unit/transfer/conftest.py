"""Fixtures of the transfer tests: owners served by real loopback gRPC servers, a receiver, a fake clock,
and the check that no test leaves a shared-memory segment behind."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from epd.transfer import (
    TransferReceiver,
    TransferSender,
    add_transfer_service,
)
from tests.unit.transfer.helpers import SMALL_CHUNK, FakeClock, my_segments


@pytest.fixture(autouse=True)
def no_leaked_segments() -> Iterator[None]:
    """Every test, whatever path it takes, must leave no segment of this process behind."""
    before = my_segments()
    yield
    assert my_segments() == before


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_owner(clock: FakeClock) -> Iterator[Callable[..., TransferSender]]:
    """Factory: a TransferSender served by a real gRPC server on 127.0.0.1; all stopped at teardown."""
    made: list[tuple[grpc.Server, TransferSender]] = []

    def make(backend: str, **kwargs) -> TransferSender:
        kwargs.setdefault("clock", clock)
        sender = TransferSender(backend, "", **kwargs)
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        add_transfer_service(server, sender)
        port = server.add_insecure_port("127.0.0.1:0")
        sender.owner_address = f"127.0.0.1:{port}"
        server.start()
        made.append((server, sender))
        return sender

    yield make
    for server, sender in made:
        server.stop(0)
        sender.close()


@pytest.fixture
def receiver() -> Iterator[TransferReceiver]:
    recv = TransferReceiver(timeout_s=5.0, max_chunk_bytes=SMALL_CHUNK)
    yield recv
    recv.close()
