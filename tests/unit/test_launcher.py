"""epd serve's launcher: what its children inherit."""

from epd.launcher import child_environment


def test_launched_workers_wait_passively_unless_the_user_chose():
    assert child_environment({"PATH": "/bin"}) == {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}
    assert child_environment({"OMP_WAIT_POLICY": "ACTIVE"})["OMP_WAIT_POLICY"] == "ACTIVE"
