"""Shared-memory segments as plain files in a tmpfs directory (/dev/shm by default).

Plain files rather than `multiprocessing.shared_memory`: no resource tracker that unlinks (or warns
about) segments a receiver merely opened, and the owner alone decides when a segment goes away.
The owner writes with pwrite, not mmap: no file descriptor is held per lease (Python's mmap keeps a
dup'ed fd open, and thousands of leases would exhaust the fd limit), and a full tmpfs surfaces as
ENOSPC from pwrite rather than as a SIGBUS on a mapped page. The receiver maps the finished segment
privately (`map_private`): no copy, and no fd kept either.

Names are `epd-<pid>-<hex>` so a leaked segment can be traced to its process; the receiver accepts
only names of that form, because the name comes off the wire and must not be a path.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import secrets
from collections.abc import Sequence

import numpy as np
import torch

_NAME_RE = re.compile(r"epd-[0-9]+-[0-9a-f]{16,64}")


def new_segment_name() -> str:
    """A fresh segment name attributable to this process."""
    return f"epd-{os.getpid()}-{secrets.token_hex(8)}"


def segment_path(shm_dir: str, name: str) -> str:
    """Path of segment `name` under `shm_dir`; ValueError for anything but an `epd-<pid>-<hex>` name."""
    if not _NAME_RE.fullmatch(name):
        raise ValueError(f"shared-memory segment name {name!r} is not of the form epd-<pid>-<hex>")
    return os.path.join(shm_dir, name)


def byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """[nbytes] uint8 CPU view of a tensor's C-contiguous bytes (a copy only if not CPU-contiguous)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)  # [numel]; reshape makes 0-d viewable
    return flat.view(torch.uint8)  # [numel * itemsize]


def device_byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """[nbytes] uint8 view of a tensor's C-contiguous bytes where it lives (a copy only if not contiguous)."""
    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)  # [numel * itemsize]


def write_segment(path: str, offsets: Sequence[int], size: int, tensors: Sequence[torch.Tensor]) -> None:
    """Create `path` exclusively (mode 0600) with `size` bytes and each tensor at its offset.

    On any failure the half-written file is removed, so a failed publish leaks nothing.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)  # the alignment gaps stay as zero-filled holes
        for offset, tensor in zip(offsets, tensors, strict=True):
            view = byte_view(tensor)
            if view.numel():
                _pwrite_all(fd, memoryview(view.numpy()), offset)
    except BaseException:
        os.close(fd)
        unlink_segment(path)
        raise
    os.close(fd)


def unlink_segment(path: str) -> bool:
    """Remove a segment; False if it was already gone. Open readers keep their copy until they close."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def open_segment(path: str) -> int:
    """Read-only fd of an existing segment; FileNotFoundError when it is gone (released, or another host)."""
    return os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)


_MADV_POPULATE_READ = 22  # Linux >= 5.14; older kernels answer EINVAL and pages are touched instead
_PAGE_BYTES = 4096


def map_private(path: str, size: int) -> torch.Tensor:
    """[size] uint8 copy-on-write mapping of a whole segment, its pages made resident before returning.

    The receiver's zero-copy read: torch maps the file privately and closes its fd at once (no fd
    per live mapping), the mapping outlives the owner's unlink (the inode lives until it is unmapped,
    when the last tensor viewing it is freed), and writes to it stay private to this process.
    FileNotFoundError when the segment is gone.
    """
    try:
        mapped = torch.from_file(path, shared=False, size=size, dtype=torch.uint8)
    except RuntimeError as err:  # torch's word for a file it cannot open or map; callers expect an OSError
        raise FileNotFoundError(f"cannot map segment {path}: {err}") from None
    if size and _libc().madvise(ctypes.c_void_p(mapped.data_ptr()), ctypes.c_size_t(size), _MADV_POPULATE_READ):
        mapped[::_PAGE_BYTES].sum()  # fault every page in now, so the transfer's time is spent here
    return mapped


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def pread_into(fd: int, buf: np.ndarray, offset: int) -> None:
    """Fill the whole uint8 array `buf` from `fd` at `offset`; EOFError if the file ends first."""
    view = memoryview(buf).cast("B")
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)  # may be short for very large reads
        if got == 0:
            raise EOFError(f"segment ended at byte {offset + done}, {len(view) - done} bytes short")
        done += got


def pread_bytes(fd: int, length: int, offset: int) -> bytes:
    """`length` bytes of `fd` at `offset`; EOFError if the file ends first."""
    parts: list[bytes] = []
    done = 0
    while done < length:
        part = os.pread(fd, length - done, offset + done)
        if not part:
            raise EOFError(f"segment ended at byte {offset + done}, {length - done} bytes short")
        parts.append(part)
        done += len(part)
    return b"".join(parts)  # CPython returns a lone bytes part itself, without a copy


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    view = view.cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)  # may be short for very large writes
