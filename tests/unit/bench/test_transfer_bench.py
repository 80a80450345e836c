"""`epd bench transfer`: backend parsing, and one small real run whose last stdout line is the JSON the
issue asks for (a figure and its medium's limit per backend, both measured, both positive)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from epd.bench.transfer import gb_per_s, median_rate, parse_backends


def test_backend_parsing():
    assert parse_backends("grpc, shm,nccl") == ["grpc", "shm", "nccl"]
    with pytest.raises(ValueError, match="'rdma' is not one of"):
        parse_backends("grpc,rdma")
    with pytest.raises(ValueError, match="names a backend twice"):
        parse_backends("shm,shm")
    with pytest.raises(ValueError, match="at least one"):
        parse_backends(" , ")


def test_rates_are_medians():
    assert gb_per_s(2_000_000_000, 2.0) == 1.0
    assert median_rate(1_000_000_000, [1.0, 0.5, 100.0]) == 1.0


@pytest.mark.timeout(180)
def test_a_small_run_prints_every_backend_beside_its_limit():
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-m", "epd", "bench", "transfer", "--backend", "grpc,shm,nccl",
                          "--size-mb", "2", "--repeats", "2", "--json"], capture_output=True, text=True, timeout=170,
                         env=env, check=True).stdout
    figures = json.loads(out.strip().splitlines()[-1])
    assert list(figures) == ["grpc", "shm", "nccl"]
    for name, f in figures.items():
        assert f["gb_per_s"] > 0 and f["limit_gb_per_s"] > 0, name
    assert figures["nccl"]["via"] in ("gloo", "nccl") and figures["grpc"]["limit"] == "loopback TCP socket"
    assert "grpc" in out.splitlines()[2]  # the table comes first
