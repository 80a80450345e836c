"""A started server's CPU time by role, from /proc: argv to role, stat lines, the process tree."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from epd.bench import process_cpu
from epd.bench.process_cpu import epd_role, per_request, role_of, tree_cpu_s
from epd.threads import process_stat


@pytest.mark.parametrize(("argv", "role"), [
    (["/venv/bin/python", "/venv/bin/epd", "decode", "--model", "m"], "decode"),
    (["/venv/bin/python", "-m", "epd", "serve", "--model", "m"], "serve"),
    (["epd", "router", "--port", "0"], "router"),
    (["/usr/bin/python3", "-m", "epd", "bench", "run"], None),  # not a server
    (["/usr/bin/python3", "worker.py", "decode"], None),
    ([], None),
])
def test_role_is_the_word_after_epd(argv, role):
    assert role_of(argv) == role


def test_stat_fields_are_counted_after_the_last_parenthesis():
    # comm may hold spaces and ")": pid (comm) state ppid ... utime(14th) stime(15th)
    line = "4242 (epd (dec) ode) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 3 0 1 2 3\n"
    assert process_stat(line) == (17, 325)


def _fake_proc(root, processes: dict[int, tuple[int, int, list[str]]]):
    """processes: pid -> (parent pid, clock ticks, argv), written as /proc/PID/{stat,cmdline}."""
    for pid, (parent, ticks, argv) in processes.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "stat").write_text(f"{pid} (python3) S {parent} 0 0 0 -1 0 0 0 0 0 {ticks} 0 0 0\n")
        (root / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (root / "self").mkdir()  # not a pid: skipped


def test_the_tree_below_the_launcher_is_summed_by_role(tmp_path):
    hz = process_cpu._TICKS_PER_S
    _fake_proc(tmp_path, {
        10: (1, 1 * hz, ["python", "-m", "epd", "serve"]),
        11: (10, 5 * hz, ["python", "/v/bin/epd", "encoder"]),
        12: (10, 3 * hz, ["python", "/v/bin/epd", "decode"]),
        13: (10, 2 * hz, ["python", "/v/bin/epd", "decode"]),  # two decode workers: one sum
        14: (12, 7 * hz, ["python", "-c", "helper"]),  # below a worker, not an epd command: left out
        20: (1, 9 * hz, ["python", "/v/bin/epd", "decode"]),  # another cluster's worker: not below 10
    })
    totals = tree_cpu_s(10, lambda pid: epd_role(pid, str(tmp_path)), proc=str(tmp_path))
    assert totals == {"serve": 1.0, "encoder": 5.0, "decode": 5.0}
    assert tree_cpu_s(99, lambda pid: "x", proc=str(tmp_path)) is None  # gone, or no /proc


def test_per_request_is_the_difference_over_the_requests():
    assert per_request({"decode": 2.0, "router": 1.0}, {"decode": 6.0, "router": 1.5, "encoder": 2.0}, 4) == \
        {"decode": 1.0, "router": 0.125, "encoder": 0.5}


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")
def test_a_real_child_s_cpu_time_is_seen(tmp_path):
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", burn])
    try:
        label = {os.getpid(): "me", child.pid: "child"}.get
        deadline = time.monotonic() + 30
        while (tree_cpu_s(os.getpid(), label) or {}).get("child", 0.0) < 0.25:
            assert time.monotonic() < deadline, "the child's CPU time never showed"
            time.sleep(0.05)
        assert tree_cpu_s(os.getpid(), label)["me"] > 0
    finally:
        child.kill()
        child.wait()
