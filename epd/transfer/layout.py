"""How bytes are cut up: tensors inside a shared-memory segment, and Pull chunk sizes.

Rules sender and receiver must agree on. Pure arithmetic on byte counts so both sides derive the
same segment layout from the TensorMeta list alone (the handle carries no offsets). Offsets are
64-byte aligned: a cache line, and enough for any element type, so a future zero-copy reader could
view the bytes in place.
"""

from __future__ import annotations

from collections.abc import Sequence

ALIGN_BYTES = 64

DEFAULT_CHUNK_BYTES = 1 << 20
MIN_CHUNK_BYTES = 4 << 10
# gRPC's default receive limit is 4 MiB per message: receivers raise it by CHUNK_HEADROOM_BYTES so a
# full-size chunk plus its meta fits.
MAX_CHUNK_BYTES = 4 << 20
CHUNK_HEADROOM_BYTES = 64 << 10


def chunk_bytes(requested: int) -> int:
    """The Pull chunk size served for a request: 0 (or less) means the default, others clamp to [4 KiB, 4 MiB]."""
    if requested <= 0:
        return DEFAULT_CHUNK_BYTES
    return max(MIN_CHUNK_BYTES, min(MAX_CHUNK_BYTES, requested))


def _align_up(value: int) -> int:
    return -(-value // ALIGN_BYTES) * ALIGN_BYTES


def shm_layout(nbytes_list: Sequence[int]) -> list[int]:
    """Byte offset of each tensor, in the given order, each aligned to ALIGN_BYTES."""
    offsets: list[int] = []
    cursor = 0
    for nbytes in nbytes_list:
        if nbytes < 0:
            raise ValueError(f"tensor byte count must be >= 0, got {nbytes}")
        offsets.append(cursor)
        cursor = _align_up(cursor + nbytes)
    return offsets


def shm_segment_bytes(nbytes_list: Sequence[int]) -> int:
    """Exact segment size: end of the last tensor (no trailing padding); 0 for no tensors."""
    if not nbytes_list:
        return 0
    return shm_layout(nbytes_list)[-1] + nbytes_list[-1]
