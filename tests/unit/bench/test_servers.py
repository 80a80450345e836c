"""Starting a server subprocess: the ready line's URL, an early exit, a start that never finishes."""

import sys
import time

import pytest

from epd.bench.servers import READY_LINE, ServerStartError, epd_serve_command, start_server


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_ready_line_gives_the_base_url_and_stop_ends_the_process():
    server = start_server(python("import time; print('starting'); "
                                 "print('EPD cluster ready: http://127.0.0.1:4242/v1 (OpenAI-compatible; gRPC "
                                 "Router at 127.0.0.1:1); Ctrl-C stops it', flush=True); time.sleep(60)"),
                          timeout_s=20)
    assert server.url == "http://127.0.0.1:4242"
    started = time.monotonic()
    assert server.stop(timeout_s=10) is not None  # SIGTERM is enough for this one
    assert time.monotonic() - started < 10


def test_an_early_exit_raises_with_the_last_lines():
    with pytest.raises(ServerStartError, match="exited with code 2.*unrecognized arguments: --colocated"):
        start_server(python("import sys; print('epd: error: unrecognized arguments: --colocated'); sys.exit(2)"),
                     name="colocated", timeout_s=20)


def test_a_server_that_never_gets_ready_is_killed_after_the_timeout():
    started = time.monotonic()
    with pytest.raises(ServerStartError, match="not ready after 0.5 s"):
        start_server(python("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"),
                     timeout_s=0.5)
    assert time.monotonic() - started < 10


def test_epd_serve_command_uses_this_interpreter_on_loopback():
    command = epd_serve_command("/m", ("--cpu-affinity", "auto"))
    assert command[:4] == [sys.executable, "-m", "epd", "serve"]
    assert command[command.index("--host") + 1] == "127.0.0.1" and command[command.index("--port") + 1] == "0"
    assert command[-2:] == ["--cpu-affinity", "auto"]
    assert READY_LINE.search("EPD cluster ready: http://127.0.0.1:8000/v1 (x)").group(1) == "http://127.0.0.1:8000"
