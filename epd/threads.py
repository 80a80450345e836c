"""One OpenMP team per worker process: the thread that runs the model.

libgomp keeps a team of helper threads per thread that has run a parallel region, and once a
process holds more OpenMP threads than it has CPUs it stops spinning between regions and sleeps
instead, which made a decode step twice as slow (22 ms -> 40 ms on the small Kimi checkpoint)
as soon as the main thread (model loading) and the engine thread each had a team. So in a worker
only the compute thread (the engine loop, the encoder's batcher) runs torch ops on several
threads; the main thread and the gRPC handler threads run theirs on one, and never make a team.

torch sets each thread's OpenMP thread count once, lazily, from its own global; the count is set
here after that, through libgomp itself, so that only the calling thread is affected (torch's
`set_num_threads` would also change the global and MKL's count for every thread).
"""

from __future__ import annotations

import ctypes
import functools
import logging

log = logging.getLogger(__name__)


@functools.cache
def _libgomp():
    """The libgomp this process has loaded (torch's own copy), or None (another OpenMP, or none)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in line and "/" in line}
    except OSError:
        return None
    if len(paths) != 1:
        return None
    return ctypes.CDLL(paths.pop())


def set_thread_compute(threads: int) -> bool:
    """Torch ops issued by the calling thread use `threads` OpenMP threads; False if it cannot be set."""
    import torch

    torch.get_num_threads()  # torch's lazy per-thread init first, or it would undo what follows
    gomp = _libgomp()
    if gomp is None:
        log.debug("no libgomp loaded; leaving this thread's OpenMP threads as they are")
        return False
    gomp.omp_set_num_threads(max(int(threads), 1))
    return True


def single_threaded() -> None:
    """For threads that only move bytes (main, gRPC handlers): no OpenMP team of their own."""
    set_thread_compute(1)
