"""epd.malloc in a fresh interpreter: tuned, an 8 MiB block comes from the heap (whose freed memory is
reused warm); untuned it is mapped anew (and unmapped on free). And the user's GLIBC_TUNABLES win."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_PROBE = """
import ctypes, sys
from epd.malloc import keep_freed_memory_warm
tuned = keep_freed_memory_warm() if sys.argv[1] == "tune" else False
libc = ctypes.CDLL(None)
libc.malloc.restype = libc.sbrk.restype = ctypes.c_void_p
block = libc.malloc(8 << 20)
print(int(tuned), int(block < libc.sbrk(0)))  # below the program break: inside the heap
"""


def _probe(mode: str, **env: str) -> tuple[bool, bool]:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True, timeout=60,
                         env={**os.environ, **env}).stdout.split()
    return out[0] == "1", out[1] == "1"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_tuned_blocks_come_from_the_heap_and_untuned_ones_are_mapped():
    assert _probe("tune") == (True, True)
    assert _probe("plain") == (False, False)


def test_the_users_tunables_win():
    assert _probe("tune", GLIBC_TUNABLES="glibc.malloc.check=0")[0] is False
