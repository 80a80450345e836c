"""This CPU's feature flags (/proc/cpuinfo): what the kernels are built for (epd.kernels.native) and
whether a half-precision dtype runs in hardware (epd.dtypes)."""

from __future__ import annotations

import functools
from pathlib import Path


def parse_flags(cpuinfo: str) -> frozenset[str] | None:
    """The first processor's flags in /proc/cpuinfo's text (x86 `flags`, ARM `Features`), or None; pure."""
    for line in cpuinfo.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.partition(":")[2].split())
    return None


@functools.cache
def cpu_flags() -> frozenset[str] | None:
    """This machine's CPU feature flags, or None where /proc/cpuinfo cannot be read or has none."""
    try:
        return parse_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        return None
