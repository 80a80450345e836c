"""A Ray worker actor's child process (epd/ray_cluster/process.py): its folder of ready file and log
goes when it stops, a folder it was given stays, and a child that dies before it is ready is
reported with its own output. Real `epd` processes (an argument error exits at once); no Ray."""

from __future__ import annotations

import pytest

from epd.ray_cluster.process import ChildProcess


def test_its_own_folder_goes_when_it_stops():
    child = ChildProcess("decode-0", ["decode", "--no-such-flag", "--ready-file", "{ready}"], "decode")
    assert child.run_dir.name.startswith("epd-ray-decode-0-") and child.run_dir.is_dir()
    assert child.proc.wait(30) == 2  # argparse's exit code
    assert child.stop() == 2
    assert not child.run_dir.exists()


def test_a_given_folder_stays(tmp_path):
    child = ChildProcess("router", ["router", "--no-such-flag", "--ready-file", "{ready}"], "router", str(tmp_path))
    child.stop(timeout_s=30)
    assert tmp_path.is_dir() and (tmp_path / "router.log").exists()


def test_a_child_that_dies_before_it_is_ready_is_reported_with_its_output():
    child = ChildProcess("prefill-0", ["prefill", "--no-such-flag", "--ready-file", "{ready}"], "prefill")
    with pytest.raises(RuntimeError, match="(?s)prefill-0 exited with code 2.*no-such-flag"):
        child.wait_ready(timeout_s=60)
    child.stop()
    assert not child.run_dir.exists()
