"""Transfer layer: move tensors between workers behind leased handles (DESIGN.md "Transfer layer").

The owner publishes tensors with a `TransferSender` and serves them with the Transfer gRPC service
(`add_transfer_service`); it hands out the returned `TransferHandle` plus the tensors' metas. A
consumer fetches them with a `TransferReceiver` and acks, so the owner frees them at once; a lease
that is never acked is freed at its TTL. Backends: `grpc` (chunked Pull stream, works anywhere) and
`shm` (one segment file per handle in /dev/shm, same host; falls back to Pull when the segment is
not visible). Failures are `TransferError`s carrying the gRPC status code to report upstream.
"""

from __future__ import annotations

from epd.transfer.errors import TransferError
from epd.transfer.labels import BACKENDS, KINDS
from epd.transfer.layout import ALIGN_BYTES, chunk_bytes, shm_layout, shm_segment_bytes
from epd.transfer.leases import LeaseTable, LeaseTableFull
from epd.transfer.receiver import TransferReceiver
from epd.transfer.sender import TransferSender
from epd.transfer.servicer import TransferServicer, add_transfer_service

__all__ = [
    "ALIGN_BYTES",
    "BACKENDS",
    "KINDS",
    "LeaseTable",
    "LeaseTableFull",
    "TransferError",
    "TransferReceiver",
    "TransferSender",
    "TransferServicer",
    "add_transfer_service",
    "chunk_bytes",
    "shm_layout",
    "shm_segment_bytes",
]
