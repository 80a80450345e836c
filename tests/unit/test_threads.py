"""Threads per engine step: by step size, wait policy and what the rest of the machine is doing."""

from __future__ import annotations

import pytest

from epd.threads import StepThreads, busy_cores_of_others, cpu_ticks, threads_sleep_between_regions


class _Load:
    def __init__(self, others: float) -> None:
        self.others = others

    def update(self) -> float:
        return self.others


def test_large_steps_use_every_thread():
    assert StepThreads(2, passive=True)(512) == 2
    assert StepThreads(2, passive=False, load=_Load(2.0))(128) == 2


def test_small_steps_run_on_one_thread_where_threads_sleep():
    assert StepThreads(2, passive=True)(16) == 1
    assert StepThreads(2, passive=True)(16, largest_chunk=1) == 1  # 16 decodes
    assert StepThreads(2, passive=True)(20, largest_chunk=15) == 1  # a chunk below prefill_chunk_tokens


def test_a_prompt_chunk_makes_a_step_large_whatever_its_size_or_the_load():
    # A cache hit leaves a short chunk to compute over a long past: it gains from every thread.
    assert StepThreads(2, passive=True)(84, largest_chunk=84) == 2
    assert StepThreads(2, passive=True)(16, largest_chunk=16) == 2
    assert StepThreads(2, passive=False, load=_Load(0.9))(40, largest_chunk=24) == 2
    assert StepThreads(1, passive=True)(84, largest_chunk=84) == 1


def test_small_steps_spin_on_every_thread_only_while_the_machine_is_otherwise_idle():
    assert StepThreads(2, passive=False, load=_Load(0.1))(16) == 2
    assert StepThreads(2, passive=False, load=_Load(0.9))(16) == 1
    assert StepThreads(1, passive=False, load=_Load(0.0))(16) == 1


def test_busy_cores_of_others_leave_our_own_ticks_out():
    # 200 ticks over 2 CPUs = 1 s; the machine was busy 150 ticks, 100 of them ours.
    assert busy_cores_of_others((0, 0, 0), (150, 200, 100), cpus=2) == 0.5
    assert busy_cores_of_others((0, 0, 0), (100, 200, 100), cpus=2) == 0.0
    assert busy_cores_of_others((5, 5, 5), (5, 5, 5), cpus=2) == 0.0


def test_wait_policy_from_the_environment():
    assert threads_sleep_between_regions({"OMP_WAIT_POLICY": "passive"})
    assert threads_sleep_between_regions({"GOMP_SPINCOUNT": "0"})
    assert not threads_sleep_between_regions({"GOMP_SPINCOUNT": "10000"})


STAT = """cpu  300 0 100 500 20 0 0 0 0 0
cpu0 100 0 50 240 10 0 0 0 0 0
cpu1 200 0 50 260 10 0 0 0 0 0
intr 12345
ctxt 678
"""


def test_cpu_ticks_count_only_the_cpus_asked_for():
    assert cpu_ticks(STAT, frozenset({1})) == (250, 520)  # busy = all - idle - iowait
    assert cpu_ticks(STAT, frozenset({0})) == (150, 400)
    assert cpu_ticks(STAT, None) == (400, 920)  # every cpuN line, not the summary line


def test_cpu_ticks_of_a_cpu_without_a_line_are_unknown():
    assert cpu_ticks(STAT, frozenset({0, 5})) is None
    assert cpu_ticks("intr 1\n", None) is None


def test_set_thread_compute_sets_the_calling_threads_count_and_keeps_the_gil():
    import ctypes
    import threading

    import torch

    from epd.threads import _libgomp, set_thread_compute

    if _libgomp() is None:
        pytest.skip("torch here is not built with libgomp")
    assert isinstance(_libgomp(), ctypes.PyDLL)  # a CDLL call would let the GIL go (see _libgomp)
    seen = []

    def worker():
        for count in (1, 3, 2):
            assert set_thread_compute(count)
            seen.append(torch.get_num_threads())

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == [1, 3, 2]
