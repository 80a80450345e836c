"""The one error type of the transfer layer, carrying the gRPC status code a servicer should report."""

from __future__ import annotations

import grpc


class TransferError(Exception):
    """A transfer that did not complete; `code` is the gRPC status to surface upstream.

    NOT_FOUND: the handle is unknown or its lease expired. UNAVAILABLE: the owner cannot be reached.
    DEADLINE_EXCEEDED: the bounded wait ran out. DATA_LOSS: the bytes received disagree with the
    metadata. INVALID_ARGUMENT: the caller's handle and metadata are inconsistent with each other.
    The message always names the handle and its owner so a log line is enough to find both ends.
    """

    def __init__(self, code: grpc.StatusCode, message: str, *, handle_id: str, owner_address: str) -> None:
        self.code = code
        self.handle_id = handle_id
        self.owner_address = owner_address
        super().__init__(f"{message} (transfer handle {handle_id!r} owned by {owner_address or '<no address>'})")
