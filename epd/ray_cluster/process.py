"""One `epd` child process inside a Ray actor: start it, wait for its ready file, stop it.

The worker runs as a child (not in the actor's own process) because a worker is a whole program:
it owns its signal handlers, its OpenMP team and its exit code, exactly as under `epd serve`.
PR_SET_PDEATHSIG ties the child to the actor: when Ray kills the actor, the child gets SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from epd.launcher import StartupFailed, child_environment, child_setup, epd_command, wait_for_file


class ChildProcess:
    def __init__(self, name: str, args: list[str], role: str, run_dir: str | None = None) -> None:
        """Start `epd ARGS`; `args` must contain `--ready-file {ready}` where {ready} is replaced."""
        self.name = name
        self._owns_run_dir = run_dir is None  # a folder of its own goes when it stops; a given one stays
        self.run_dir = Path(run_dir or tempfile.mkdtemp(prefix=f"epd-ray-{name}-"))
        self.ready_file = self.run_dir / f"{name}.json"
        args = [str(self.ready_file) if a == "{ready}" else a for a in args]
        self.log_path = self.run_dir / f"{name}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - open for the child's whole life
        self.proc = subprocess.Popen(epd_command() + args, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, preexec_fn=child_setup(),
                                     start_new_session=True, env=child_environment(os.environ, None, role))

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def log_tail(self, limit: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_bytes()[-limit:].decode(errors="replace")
        return ""

    def check_alive(self) -> None:
        """RuntimeError with the child's last output if it has exited."""
        code = self.proc.poll()
        if code is not None:
            raise RuntimeError(f"{self.name} exited with code {code} before it was ready:\n{self.log_tail()}")

    def wait_ready(self, timeout_s: float) -> dict:
        """The ready file's JSON; RuntimeError (with the child's last output) if it exits or times out."""
        try:
            return wait_for_file(self.ready_file, timeout_s, self.check_alive)
        except StartupFailed as exc:  # timed out (a death raises from check_alive): stop it, show its output
            self._terminate()
            tail = self.log_tail()
            self.stop()
            raise RuntimeError(f"{exc}:\n{tail}") from None

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """`_terminate`, then the folder (ready file and log) goes, if this made it."""
        self._terminate(timeout_s)
        if self._owns_run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        return self.proc.returncode

    def _terminate(self, timeout_s: float = 10.0) -> None:
        """SIGTERM (a worker finishes the calls it has, bounded), then SIGKILL after `timeout_s`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()
