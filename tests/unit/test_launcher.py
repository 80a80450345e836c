"""epd serve's launcher: what its children inherit."""

from epd.launcher import Cluster, ServeOptions, child_environment


def test_launched_workers_wait_passively_unless_the_user_chose():
    assert child_environment({"PATH": "/bin"}) == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}
    assert child_environment({"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"
    assert child_environment({"GOMP_SPINCOUNT": "5"}) == {"GOMP_SPINCOUNT": "5"}


def test_a_worker_on_cores_of_its_own_spins_briefly():
    env = child_environment({}, (1,), exclusive=True)
    assert env == {"GOMP_SPINCOUNT": "10000", "OMP_NUM_THREADS": "1"}


def test_only_decode_is_exclusive_under_auto_affinity(monkeypatch):
    monkeypatch.setattr("epd.launcher.available_cpus", lambda: [0, 1])
    cluster = Cluster(ServeOptions("model", cpu_affinity="auto"))
    try:
        assert [n for n, _ in cluster.options.processes() if cluster._exclusive(n)] == ["decode-0"]
    finally:
        cluster.stop()
