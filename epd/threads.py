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
from dataclasses import dataclass

log = logging.getLogger(__name__)


@functools.cache
def _libgomp():
    """The libgomp this process has loaded (torch's own copy), or None (another OpenMP, or none).

    Loaded as a PyDLL, whose calls keep the GIL: a CDLL call lets it go, and in a decode worker
    the gRPC threads that each step's tokens woke take it, so the engine loop waited for it back
    at every step (3.9% of a decode worker's samples in a 16-stream burst, py-spy) for a call that
    only stores a number."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in line and "/" in line}
    except OSError:
        return None
    if len(paths) != 1:
        return None
    return ctypes.PyDLL(paths.pop())


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


def threads_sleep_between_regions(env: dict[str, str]) -> bool:
    """Whether OpenMP threads here sleep after each parallel region (passive waiting)."""
    return env.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE" or env.get("GOMP_SPINCOUNT") == "0"


def busy_cores_of_others(before: tuple[int, int, int], after: tuple[int, int, int], cpus: int) -> float:
    """Cores other processes kept busy between two samples of (busy ticks of our CPUs, all ticks of
    our CPUs, this process's ticks), `cpus` being how many CPUs are ours; pure, for `HostLoad`."""
    busy, total, own = (b - a for a, b in zip(before, after, strict=True))
    if total <= 0:
        return 0.0
    return max(busy - own, 0) / total * cpus


def process_stat(stat_text: str) -> tuple[int, int]:
    """(parent pid, user + system clock ticks) from a /proc/PID/stat line; pure.

    The command name (in parentheses) may hold spaces and parentheses itself: fields are counted
    after its last ")"."""
    fields = stat_text.rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[11]) + int(fields[12])


def cpu_ticks(stat_text: str, cpus: frozenset[int] | None) -> tuple[int, int] | None:
    """(busy ticks, all ticks) of the given CPUs (None: all of them) from /proc/stat's text; pure.

    None when a CPU asked for has no line (a CPU set from another machine, or an odd /proc)."""
    busy = total = 0
    seen: set[int] = set()
    for line in stat_text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit():
            continue
        cpu = int(name[3:])
        if cpus is not None and cpu not in cpus:
            continue
        fields = [int(x) for x in rest.split()[:8]]  # user nice system idle iowait irq softirq steal
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        busy += sum(fields) - idle
        total += sum(fields)
        seen.add(cpu)
    if not seen or (cpus is not None and seen != cpus):
        return None
    return busy, total


class HostLoad:
    """How busy other processes keep this process's CPUs, from /proc (sampled at most every `period_s`).

    Only the CPUs this process may run on count: a decode worker pinned to a core of its own
    (`--cpu-affinity auto`) is not contended by an encoder busy on the other core. Our own ticks
    are taken out, so a step that spins on every core does not look like contention.

    Sampled every 50 ms (two reads of /proc, tens of microseconds): at 250 ms a paced decode worker
    went on seeing the burst's last prompts as load for up to a quarter of a second after they
    ended, and ran its batch-16 tail on one thread meanwhile (16 Kimi requests, `--decode-step-
    interval-ms 400`, two compares of one build: 216 against 210 and 209 against 200 tok/s; unpaced
    the same, 180 against 181). The load is then counted in steps of a fifth of a core (10 ms
    ticks over 50 ms on 2 CPUs), finer than the thresholds it is held against (0.3 and 0.5 cores).
    """

    def __init__(self, period_s: float = 0.05, clock=None) -> None:
        import os
        import time

        self.period_s = period_s
        mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        self.cpu_set = frozenset(mine) if mine else None
        self.cpus = len(mine) if mine else (os.cpu_count() or 1)
        self._clock = clock or time.monotonic
        self._last = self._sample()
        self._at = self._clock()
        self.others = 0.0  # busy cores (of ours) of other processes over the last period

    def update(self, period_s: float | None = None) -> float:
        """Busy cores of others, from a fresh sample if the last is `period_s` (default: ours) old."""
        now = self._clock()
        if now - self._at >= (self.period_s if period_s is None else period_s):
            sample = self._sample()
            if sample is not None and self._last is not None:
                self.others = busy_cores_of_others(self._last, sample, self.cpus)
            self._last, self._at = sample, now
        return self.others

    def _sample(self) -> tuple[int, int, int] | None:
        try:
            with open("/proc/stat") as stat:
                ticks = cpu_ticks(stat.read(), self.cpu_set)
            with open("/proc/self/stat") as own:
                _, mine = process_stat(own.read())
        except (OSError, ValueError, IndexError):
            return None
        if ticks is None:
            return None
        return ticks[0], ticks[1], mine


@dataclass
class StepThreads:
    """OpenMP threads for one engine step, by the tokens it computes and who else wants the cores.

    Large steps (prefill chunks: a few big matrix products) use every thread. A step counts as large
    by its size, or because it carries a prompt chunk of `prefill_chunk_tokens` or more: even a short
    chunk attends over its whole cached past and sends every token through most experts, so two
    sleeping threads ran an 84-token chunk after a 256-token cache hit in 0.77x (Kimi, float32) to
    0.96x (Qwen, bfloat16) of one thread's time (at 8 tokens: 0.82x-1.02x). That chunk is all a
    reused image's prompt computes, so it sets the cache hit's TTFT. A small step (decodes:
    hundreds of small operations) gains from more threads only if they spin between operations;
    threads that sleep cost more to wake than they add (on 2 CPUs a batch-16 decode step took
    51 ms on two sleeping threads, 40 ms on one, 27 ms on two spinning ones). And spinning threads
    take cores other workers need. So small steps run on one thread where threads sleep, or while
    other processes keep more than `busy_threshold` cores busy; otherwise on all of them.
    """

    threads: int
    passive: bool
    load: HostLoad | None = None
    small_step_tokens: int = 128
    prefill_chunk_tokens: int = 16
    busy_threshold: float = 0.3

    def __call__(self, num_tokens: int, largest_chunk: int = 1) -> int:
        """`largest_chunk`: the most tokens one sequence computes in the step (1 for decodes)."""
        if num_tokens >= self.small_step_tokens or largest_chunk >= self.prefill_chunk_tokens:
            return self.threads
        if self.passive or self.threads == 1:
            return 1
        contended = self.load is not None and self.load.update() > self.busy_threshold
        return 1 if contended else self.threads
