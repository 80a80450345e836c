"""CPU-seconds of a started server's processes by role, from /proc (Linux): where a load's cores went.

On a machine whose workers share a few cores, a column's throughput says little about why; its
processes' CPU time does (on 2 vCPUs a 16-request `image-1` burst's decode worker took a third of
both cores however cheap its steps were; bench/README.md). `epd serve` runs each worker as an `epd
ROLE ...` process under its launcher, so the launcher's process tree, sampled before and after a
run, gives each role's CPU time over that run (several workers of a role: one sum).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from epd.threads import process_stat

ROLES = ("router", "encoder", "prefill", "decode", "colocated", "serve")  # a request's path, then the launcher
_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def role_of(argv: list[str]) -> str | None:
    """The `epd` command a process runs ("serve" is the launcher), from its argv; None for any other; pure.

    `epd ROLE`, `python /venv/bin/epd ROLE` and `python -m epd ROLE` all name it right after "epd"."""
    for arg, following in zip(argv, argv[1:], strict=False):
        if arg == "epd" or arg.endswith("/epd"):
            return following if following in ROLES else None
    return None


def tree_cpu_s(root: int, label: Callable[[int], str | None], proc: str = "/proc") -> dict[str, float] | None:
    """CPU-seconds so far of `root` and every process below it, summed by `label(pid)` (None: left
    out); None where there is no /proc. A process that ends between the reads is simply missing."""
    if not os.path.isdir(os.path.join(proc, str(root))):
        return None
    parents, ticks = {}, {}
    for name in os.listdir(proc):
        if name.isdigit():
            try:
                with open(os.path.join(proc, name, "stat")) as f:
                    parents[int(name)], ticks[int(name)] = process_stat(f.read())
            except (OSError, ValueError, IndexError):
                continue
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    totals: dict[str, float] = {}
    pending = [root]
    while pending:
        pid = pending.pop()
        pending += children.get(pid, [])
        name = label(pid)
        if name is not None and pid in ticks:
            totals[name] = totals.get(name, 0.0) + ticks[pid] / _TICKS_PER_S
    return totals


def epd_role(pid: int, proc: str = "/proc") -> str | None:
    """The `epd` command process `pid` runs (see `role_of`), or None."""
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as f:
            argv = [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
    except OSError:
        return None
    return role_of(argv)


def per_request(before: Mapping[str, float], after: Mapping[str, float], requests: int) -> dict[str, float]:
    """Each role's CPU-seconds between two samples, divided by `requests`; pure."""
    return {role: (after[role] - before.get(role, 0.0)) / max(requests, 1) for role in after}
