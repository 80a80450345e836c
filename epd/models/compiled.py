"""A library function compiled by torch.compile, kept only where it equals the library bit for bit.

The engine promises transformers' tokens, so a compiled function may replace the library's only if
it computes the same bits. Inductor builds its C++ without floating-point contraction (no fused
multiply-add) and converts dtypes as ATen does, so an elementwise function compiles to the same
arithmetic in one loop; that is checked here rather than assumed: the first call for each kind of
input (dtype, device, rank) runs both and keeps the compiled result only if the two are equal. Where
they differ, or compiling fails (no C++ compiler, say), the library's function serves from then on,
after one warning: a request never fails or changes for want of a compiled kernel.

`EPD_COMPILE=0` in the environment keeps every library function as it is.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

# Kernels take the calling thread's OpenMP thread count (the worker's compute thread sets it,
# epd.threads) instead of the count at compile time; no pool of compile processes in a worker.
_INDUCTOR_OPTIONS = {"cpp.dynamic_threads": True, "compile_threads": 1}


def compile_enabled(env: dict[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get("EPD_COMPILE", "1").strip().lower() not in ("0", "false", "no", "off")


def _kind(args: tuple) -> tuple:
    """What a compiled graph is specialised on, as far as the check cares: dtype, device, rank."""
    return tuple((a.dtype, a.device.type, a.dim()) for a in args if isinstance(a, torch.Tensor))


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, tuple | list):
        return isinstance(b, tuple | list) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


class CheckedCompile:
    """Calls like `eager`; runs a compiled copy once it has matched `eager` on this kind of input."""

    def __init__(self, eager: Callable, name: str):
        # Compiling imports torch.utils.cpp_extension, whose one warning on a machine without CUDA (from
        # a CUDA build of torch: "No CUDA runtime is found") says nothing a user of a CPU worker can act on.
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        self.eager = eager
        self.name = name
        self._compiled: Callable | None = torch.compile(eager, dynamic=True, options=_INDUCTOR_OPTIONS)
        self._checked: set[tuple] = set()  # input kinds whose compiled output equalled eager's
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        """Whether the compiled copy is still in use (it is dropped on any mismatch or failure)."""
        return self._compiled is not None

    def __call__(self, *args):
        compiled = self._compiled
        if compiled is None:
            return self.eager(*args)
        kind = _kind(args)
        if kind not in self._checked:
            return self._check(args, kind)
        try:
            return compiled(*args)
        except Exception as exc:  # a recompile that fails must not fail the request
            self._give_up(f"compiling failed ({exc})")
            return self.eager(*args)

    def _check(self, args: tuple, kind: tuple):
        with self._lock:
            expected = self.eager(*args)
            if self._compiled is None:
                return expected
            try:
                got = self._compiled(*args)
            except Exception as exc:
                self._give_up(f"compiling failed ({exc})")
                return expected
            if not _same(got, expected):
                self._give_up("its output differs from the library's")
                return expected
            self._checked.add(kind)
            log.info("%s: compiled, same output as the library's for %s", self.name, kind)
            return expected

    def _give_up(self, why: str) -> None:
        if self._compiled is not None:
            log.warning("%s: using the library's function, not a compiled copy: %s", self.name, why)
        self._compiled = None
