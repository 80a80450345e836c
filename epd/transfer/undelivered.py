"""Free the leases of a reply that never reached its caller.

A worker that answers with transfer handles (an image's embeddings, a prompt's KV blocks) keeps the
tensors until the handle is pulled or released, or its TTL (60 s by default) runs out. A caller that
leaves while the answer is computed is usually seen by the handler (`context.is_active()`), which
then publishes nothing. A cancel that arrives while the answer is being sent is not: the handler has
returned, the transport drops the reply, and the leases in it wait out their TTL, holding a copy of
the blocks or embeddings nobody will pull.

gRPC's server learns how a call ended (cancelled or not) when it terminates, and runs the callbacks
registered with `context.add_callback` then. It has no public accessor for that outcome, so
`call_cancelled` reads the per-call state grpc keeps for `is_active()`. A grpc release that renames it
makes `call_cancelled` answer False (the TTL frees the leases, as before this module), and
`tests/unit/transfer/test_undelivered.py` fails, so an upgrade cannot hide the change.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

import grpc

if TYPE_CHECKING:
    from epd.transfer.sender import TransferSender

log = logging.getLogger(__name__)

_CANCELLED = "cancelled"  # grpc._server._CANCELLED: the client cancelled, the deadline passed or the connection broke


def call_cancelled(context: grpc.ServicerContext) -> bool:
    """Whether gRPC saw this call cancelled before its reply was delivered (False while it is running)."""
    return getattr(getattr(context, "_state", None), "client", None) == _CANCELLED


def release_if_undelivered(context: grpc.ServicerContext, sender: TransferSender, handle_ids: Iterable[str]) -> None:
    """Release `handle_ids` on `sender` once the call has ended, if it ended cancelled (its reply never
    arrived).

    Register before returning a reply that holds the handles. If the call has already ended (the
    caller left during the handler), the check runs now, on this thread; else on gRPC's, when it ends.
    """
    handle_ids = list(handle_ids)

    def ended() -> None:
        if not call_cancelled(context):
            return
        try:
            for handle_id in handle_ids:
                sender.release(handle_id)
        except Exception:  # on gRPC's thread: log, never raise into the server
            log.exception("releasing the leases of an undelivered reply failed; their TTL will free them")

    if not context.add_callback(ended):
        ended()
