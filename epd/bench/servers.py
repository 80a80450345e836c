"""Start `epd serve` as a subprocess for a benchmark, wait (bounded) for its ready line, stop it for sure."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

# What epd.launcher prints once the router reports /ready.
READY_LINE = re.compile(r"EPD cluster ready: (https?://\S+?)/v1\b")
_TAIL_LINES = 40


class ServerStartError(RuntimeError):
    """The server exited or stayed unready; the message carries the tail of its output."""


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    url: str  # base URL, without /v1
    output: deque[str] = field(default_factory=lambda: deque(maxlen=_TAIL_LINES))

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM the launcher (it stops its workers in order); SIGKILL the whole group if it hangs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(self.proc)
            return None

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *_) -> None:
        self.stop()


def epd_serve_command(model_dir: str, extra_args: Sequence[str] = ()) -> list[str]:
    """This interpreter's `epd serve` (the venv's), on loopback, on a free port."""
    return [sys.executable, "-m", "epd", "serve", "--model", model_dir, "--host", "127.0.0.1", "--port", "0",
            *extra_args]


def start_server(command: Sequence[str], *, name: str = "the server", timeout_s: float = 600.0,
                 env: dict[str, str] | None = None) -> ServerProcess:
    """Run `command` and return once it prints `EPD cluster ready: URL/v1`; raise ServerStartError if not."""
    proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, **(env or {})})
    tail: deque[str] = deque(maxlen=_TAIL_LINES)
    lines: queue.Queue[str | None] = queue.Queue()
    started = threading.Event()  # set once ready: from then on only the tail is kept, not a growing queue
    threading.Thread(target=_pump, args=(proc.stdout, tail, lines, started), daemon=True).start()
    try:
        url = _wait_ready(proc, name, tail, lines, timeout_s)
    except BaseException:  # Ctrl-C too: the child is in its own session, so nothing else would stop it
        _kill_group(proc)
        raise
    started.set()
    return ServerProcess(proc, url, tail)


def _wait_ready(proc: subprocess.Popen, name: str, tail: deque[str], lines: queue.Queue, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            break
        if line is None:  # end of output: the process is exiting
            raise _exited(proc, name, tail)
        match = READY_LINE.search(line)
        if match:
            return match.group(1)
    raise ServerStartError(f"{name} was not ready after {timeout_s:g} s" + _last_lines(tail))


def _pump(stream, tail: deque[str], lines: queue.Queue, started: threading.Event) -> None:
    """Keep reading (a full pipe would block the server) and remember the last lines for errors."""
    for line in stream:
        tail.append(line.rstrip("\n"))
        if not started.is_set():
            lines.put(line)
    lines.put(None)


def _exited(proc: subprocess.Popen, name: str, tail: deque[str]) -> ServerStartError:
    try:
        reason = f"exited with code {proc.wait(10)}"
    except subprocess.TimeoutExpired:  # closed its output but lives on (the caller kills it)
        reason = "closed its output before it was ready"
    return ServerStartError(f"{name} {reason}" + _last_lines(tail))


def _last_lines(tail: deque[str]) -> str:
    last = [line.strip() for line in tail if line.strip()][-5:]
    return ": " + " | ".join(last) if last else ""


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):  # unkillable (D state): nothing more to do
        proc.wait(5)
