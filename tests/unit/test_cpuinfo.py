"""Reading the CPU's feature flags from /proc/cpuinfo's text. Model-free."""

from __future__ import annotations

from pathlib import Path

from epd.cpuinfo import cpu_flags, parse_flags

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2 avx avx2 fma
bugs\t\t: sysret_ss_attrs

processor\t: 1
flags\t\t: fpu sse2 avx avx2 fma
"""
ARM = """processor\t: 0
BogoMIPS\t: 2100.00
Features\t: fp asimd asimdhp bf16 sve
CPU implementer\t: 0x41
"""


def test_x86_flags_and_arm_features_are_read():
    assert parse_flags(X86) == {"fpu", "sse2", "avx", "avx2", "fma"}
    assert parse_flags(ARM) == {"fp", "asimd", "asimdhp", "bf16", "sve"}


def test_no_flags_line_is_none():
    assert parse_flags("processor\t: 0\nmodel name\t: something\n") is None
    assert parse_flags("") is None


def test_this_machine_s_flags_are_read():
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists():
        assert cpu_flags() is None
        return
    flags = cpu_flags()
    assert flags and flags == parse_flags(cpuinfo.read_text())  # Linux on x86 and ARM lists some
