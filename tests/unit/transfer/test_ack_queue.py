"""AckQueue: a fetch's ack is queued and sent by one thread; a full or closed queue sends inline; waits are bounded."""

from __future__ import annotations

import threading

import pytest

from epd.transfer.acks import AckQueue


class Owner:
    """Records acks; `gate` holds each send until the test opens it."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.acked: list[tuple[str, str]] = []  # (item, name of the thread that sent it)

    def send(self, item: str) -> None:
        self.gate.wait(5)
        self.acked.append((item, threading.current_thread().name))


def test_a_queued_ack_is_sent_by_the_ack_thread_not_the_caller():
    owner = Owner()
    acks = AckQueue(owner.send, max_pending=4)
    acks.submit("h1")  # returns at once although the owner has not answered
    assert acks.pending() == 1 and acks.wait(0.05) is False and owner.acked == []
    owner.gate.set()
    assert acks.wait(5) is True and acks.pending() == 0
    assert owner.acked == [("h1", "epd-transfer-acks")]
    assert acks.close(1) is True


def test_when_the_queue_is_full_the_caller_sends_its_own_ack():
    owner = Owner()
    acks = AckQueue(owner.send, max_pending=1)
    acks.submit("h1")  # taken by the thread, which waits at the gate
    assert _until(lambda: acks._queue.qsize() == 0)
    acks.submit("h2")  # queued: the queue is now full
    threading.Timer(0.05, owner.gate.set).start()
    acks.submit("h3")  # full: sent inline, so it returns only once the owner answered
    assert ("h3", threading.current_thread().name) in owner.acked
    assert acks.close(5) is True
    assert sorted(item for item, _ in owner.acked) == ["h1", "h2", "h3"]


def test_after_close_acks_are_sent_inline():
    owner = Owner()
    owner.gate.set()
    acks = AckQueue(owner.send)
    assert acks.close(1) is True
    acks.submit("late")
    assert owner.acked == [("late", threading.current_thread().name)]


def test_a_send_that_raises_does_not_stop_later_acks():
    sent = []

    def send(item: str) -> None:
        if item == "bad":
            raise RuntimeError("boom")
        sent.append(item)

    acks = AckQueue(send)
    acks.submit("bad")
    acks.submit("good")
    assert acks.wait(5) and sent == ["good"]
    acks.close(1)


def test_max_pending_must_be_positive():
    with pytest.raises(ValueError, match="max_pending"):
        AckQueue(lambda _: None, max_pending=0)


def _until(check, timeout_s: float = 5.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True
