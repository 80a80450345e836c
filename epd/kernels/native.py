"""Build and load the C++ kernels in this folder, once per process, cached per machine.

torch has no paged decode attention on a CPU: its path gathers every context into a padded copy
and multiplies that (`attention.decode_attention`); `paged_decode.cpp` reads the block pool in
place. `rms_norm.cpp` is the language model's RMSNorm in one pass instead of seven operators,
`moe.cpp` the weighted sum that ends an MoE layer's experts in one pass instead of four, and
`moe_decode.cpp` a decode step's experts reading only the busy experts' weights, and
`linear_decode.cpp` a float32 decode step's dense layers (both multiply as `row_products.h` does);
`gelu_tanh.cpp` is the vision towers' activation, for the encoder; `rope_interleave.cpp` the latent
attention's rotary embedding in one call instead of twenty-odd operators, with the library's bits.
They are built with torch's own extension builder (ninja + the system C++ compiler, as inductor
builds its CPU kernels) for this CPU (`-march=native`), the first time a worker on the machine
needs them (about 5 s), into a folder keyed by torch's version and the CPU's feature flags, so a
second worker, or the next start, loads them in well under a second. A machine without a
compiler falls back to torch's operators (`--kernels auto`) or refuses to start (`--kernels native`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from epd.cpuinfo import cpu_flags

log = logging.getLogger(__name__)

SOURCES = tuple(Path(__file__).with_name(name)
                for name in ("paged_decode.cpp", "rms_norm.cpp", "moe.cpp", "moe_decode.cpp", "linear_decode.cpp",
                             "gelu_tanh.cpp", "rope_interleave.cpp", "softmax_rows.cpp"))
# -fopenmp: at::parallel_for is inlined from ATen's headers into our code, and without it its
# `#pragma omp parallel` is dropped: every kernel ran on one thread whatever torch's thread count
# (linear_rows at 16 x 512 x 3072: 335 us on one thread or two; with it, 200-212 on two). The
# library then needs libgomp.so.1, the one torch has loaded (the same soname: one OpenMP runtime).
CFLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fopenmp"]
LDFLAGS = ["-fopenmp"]


@dataclass(frozen=True)
class BuildResult:
    ok: bool
    detail: str  # where it was loaded from and how long it took, or why it could not be built


_lock = threading.Lock()
_result: BuildResult | None = None


def cache_dir() -> Path:
    """$EPD_KERNEL_CACHE, else ~/.cache/epd/kernels/<torch version>-<CPU digest>: -march=native code
    runs only on CPUs with the build machine's features, so a home folder shared by several
    machines keeps one build per kind of CPU."""
    if os.environ.get("EPD_KERNEL_CACHE"):
        return Path(os.environ["EPD_KERNEL_CACHE"])
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "epd" / "kernels"
    return root / f"torch-{torch.__version__.replace('+', '_')}-{cpu_digest()}"


def cpu_digest() -> str:
    """A short digest of the CPU's architecture and feature flags (what -march=native compiles for)."""
    flags = " ".join(sorted(cpu_flags() or ()))
    return hashlib.sha256(f"{platform.machine()}|{flags}".encode()).hexdigest()[:12]


def load_kernels() -> BuildResult:
    """Build (first time on this machine) and load `torch.ops.epd.paged_decode`, `.rms_norm`,
    `.moe_combine`, `.moe_decode`, `.linear_decode`, `.linear_rows`, `.gelu_tanh` and `.rope_interleave`;
    memoised per process."""
    global _result
    with _lock:
        if _result is None:
            _result = build(SOURCES, cache_dir(), "epd_kernels")
            (log.info if _result.ok else log.warning)("native kernels: %s", _result.detail)
        return _result


def build(sources: tuple[Path, ...], directory: Path, name: str) -> BuildResult:
    """Compile `sources` into one library in `directory` (torch rebuilds when a source or the flags
    change) and load it."""
    # Importing the builder on a CPU-only machine logs "No CUDA runtime is found" at WARNING: not
    # news to a CPU worker, so that one import runs with the builder's logger quietened.
    quiet = logging.getLogger("torch.utils.cpp_extension")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        from torch.utils.cpp_extension import load
    finally:
        quiet.setLevel(level)
    started = time.perf_counter()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        load(name, sources=[str(source) for source in sources], extra_cflags=CFLAGS, extra_ldflags=LDFLAGS,
             is_python_module=False, build_directory=str(directory), verbose=False)
    except Exception as exc:  # a missing compiler or ninja, a read-only cache: fall back, saying why
        lines = [line for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
        # The compiler's own "file:line: error: ..." says most; else torch's summary, else the first line.
        found = [line for line in lines if ": error" in line] or [line for line in lines if "error" in line.lower()]
        names = ", ".join(source.name for source in sources)
        return BuildResult(False, f"could not build {names} in {directory}: {(found or lines)[0].strip()[:300]}")
    return BuildResult(True, f"loaded from {directory} in {time.perf_counter() - started:.1f} s")
