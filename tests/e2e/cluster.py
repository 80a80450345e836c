"""Start `epd serve` (or one `epd` service) as a real process tree on loopback, and stop it for sure."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

EPD = [sys.executable, str(Path(sys.executable).parent / "epd")]
READY = re.compile(r"EPD cluster ready: (http://\S+)/v1 .*gRPC Router at (\S+)\)")


def children_of(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc (no psutil on a fresh machine)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def free_port() -> int:
    """A port nothing listens on right now (for a worker that must come back on the same address)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_ready_file(path: Path, procs: list[subprocess.Popen], timeout_s: float = 120) -> dict:
    """The JSON a service writes once ready; fails if any of `procs` exits first or time runs out."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} not written in {timeout_s} s"
        assert all(p.poll() is None for p in procs), "a process exited during start-up"
        time.sleep(0.2)
    return json.loads(path.read_text())


@dataclass
class RunningCluster:
    proc: subprocess.Popen
    url: str
    grpc_address: str
    output: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def worker_pids(self) -> list[int]:
        return children_of(self.proc.pid)

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
            raise


def _pump(stream, sink: list[str], echo) -> None:
    for line in stream:
        sink.append(line)
        echo.write(line)


def start_cluster(model_dir: str | None, *extra: str, timeout_s: float = 300.0,
                  env: dict[str, str] | None = None, command: tuple[str, ...] = ("serve",)) -> RunningCluster:
    """`epd serve [--model DIR] --port 0 ...` (or another `command`, e.g. `ray up`); returns once it
    printed its ready line."""
    model = ["--model", model_dir] if model_dir else []
    proc = subprocess.Popen([*EPD, *command, *model, "--port", "0", *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, **(env or {})})
    output: list[str] = []
    threading.Thread(target=_pump, args=(proc.stdout, output, sys.stderr), daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in list(output):
            match = READY.search(line)
            if match:
                return RunningCluster(proc, match.group(1), match.group(2), output)
        if proc.poll() is not None:
            raise RuntimeError(f"epd {' '.join(command)} exited with {proc.returncode}:\n{''.join(output)}")
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError(f"epd {' '.join(command)} not ready after {timeout_s} s:\n{''.join(output)}")


def worker_states(url: str) -> dict[str, str]:
    """The router's /workers as address -> state."""
    import httpx

    return {w["address"]: w["state"] for w in httpx.get(f"{url}/workers", timeout=10).json()["workers"]}


def until(check, timeout_s: float, what: str) -> float:
    """Poll `check` every 0.2 s; fail with `what` after `timeout_s`; returns the seconds it took."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout_s, what
        time.sleep(0.2)
    return time.monotonic() - started


class Processes:
    """Single `epd` services started by a test (each with a ready file), all stopped at the end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.procs = tmp, {}

    def start(self, name: str, *args: str) -> Path:
        ready = self.tmp / f"{name}.json"
        ready.unlink(missing_ok=True)
        self.procs[name] = subprocess.Popen([*EPD, *args, "--ready-file", str(ready)])
        return ready

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            p.wait(30)
