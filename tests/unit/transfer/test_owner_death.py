"""An owner process SIGKILLed in the middle of a large transfer: the puller gets a TransferError naming
the owner well within its deadline (no hang), and drops its group with the dead owner."""

from __future__ import annotations

import os
import signal
import threading
import time

import grpc
import pytest

from epd.bench.transfer import Peer
from epd.transfer import TransferError, TransferReceiver

SIZE = 384 << 20  # ~0.3 s or more at loopback speeds here: long enough to be killed in the middle
TIMEOUT_S = 20.0
MARGIN_S = 5.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backend", ["nccl", "grpc"])
def test_owner_killed_mid_transfer_fails_fast_and_drops_the_group(backend):
    receiver = TransferReceiver(timeout_s=TIMEOUT_S)
    try:
        with Peer(backend, SIZE) as peer:
            handle, meta = peer.publish()
            receiver.fetch(handle, [meta], "kv")  # warm: the channel, and for nccl the pair's group
            if backend == "nccl":
                assert receiver.group_backend(peer.address) == "gloo"
            handle, meta = peer.publish()
            outcome: dict = {}

            def fetch() -> None:
                started = time.monotonic()
                try:
                    receiver.fetch(handle, [meta], "kv")
                    outcome["error"] = None
                except TransferError as err:
                    outcome["error"] = err
                outcome["seconds"] = time.monotonic() - started

            puller = threading.Thread(target=fetch)
            puller.start()
            time.sleep(0.1)
            os.kill(peer.pid, signal.SIGKILL)
            puller.join(TIMEOUT_S + MARGIN_S)
            assert not puller.is_alive(), "the puller hangs on a dead owner"
        err = outcome["error"]
        assert err is not None, "the transfer finished before the owner was killed: make SIZE larger"
        assert err.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED)
        assert err.owner_address == peer.address and peer.address in str(err)
        assert outcome["seconds"] < TIMEOUT_S / 2  # told by the side channel, not by waiting out a timeout
        assert receiver.group_backend(peer.address) is None  # the group with the dead owner is gone
    finally:
        receiver.close()
