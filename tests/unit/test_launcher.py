"""epd serve's launcher: what its children inherit."""

from epd.launcher import child_environment


def test_encoders_and_prefill_wait_passively_unless_the_user_chose():
    assert child_environment({"PATH": "/bin"}, role="encoder") == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}
    assert child_environment({}, role="prefill") == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert child_environment({"OMP_WAIT_POLICY": "ACTIVE"}, role="prefill")["OMP_WAIT_POLICY"] == "ACTIVE"
    assert child_environment({"GOMP_SPINCOUNT": "5"}, role="decode") == {"GOMP_SPINCOUNT": "5"}


def test_decode_threads_spin_briefly():
    assert child_environment({}, role="decode") == {"GOMP_SPINCOUNT": "10000"}
    assert child_environment({}, role="colocated") == {"GOMP_SPINCOUNT": "10000"}


def test_a_pinned_worker_runs_one_thread_per_cpu():
    assert child_environment({}, (1,), role="decode") == {"GOMP_SPINCOUNT": "10000", "OMP_NUM_THREADS": "1"}


def test_per_process_ports_are_not_inherited():
    """EPD_PORT / EPD_METRICS_PORT set for `epd serve` would give every child the same port."""
    parent = {"EPD_PORT": "9000", "EPD_METRICS_PORT": "9001", "EPD_GRPC_PORT": "9002", "EPD_MODEL": "/m"}
    for role in ("encoder", "prefill", "decode", "router"):
        env = child_environment(parent, role=role)
        assert "EPD_PORT" not in env and "EPD_METRICS_PORT" not in env and "EPD_GRPC_PORT" not in env
        assert env["EPD_MODEL"] == "/m"
