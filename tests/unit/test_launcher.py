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
