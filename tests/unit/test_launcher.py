"""epd serve's launcher: what its children inherit and the flags each is given."""

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


def test_each_worker_gets_the_engine_flags_it_takes(monkeypatch):
    """Engine workers get every engine flag; an encoder only --kernels (its vision tower's GELU)."""
    import shutil

    import pytest

    from epd.launcher import Cluster, ServeOptions

    class Started:
        def poll(self):
            return None

    class RouterStarting(Exception):
        pass

    cluster = Cluster(ServeOptions(model_dir="/m", engine_args=("--kv-blocks", "64", "--kernels", "torch")))
    commands: dict[str, list[str]] = {}

    def wait_file(path):
        if path.stem == "router":
            raise RouterStarting
        return {"address": f"127.0.0.1:{len(commands)}", "metrics_port": 1, "role": path.stem.split("-")[0]}

    monkeypatch.setattr(cluster, "_popen", lambda name, args: commands.setdefault(name, args) and Started())
    monkeypatch.setattr(cluster, "_wait_file", wait_file)
    try:
        with pytest.raises(RouterStarting):
            cluster.start()
    finally:
        shutil.rmtree(cluster.run_dir)
    encoder, decode = commands["encoder-0"], commands["decode-0"]
    assert encoder[encoder.index("--kernels") + 1] == "torch" and "--kv-blocks" not in encoder
    assert decode[decode.index("--kernels") + 1] == "torch" and decode[decode.index("--kv-blocks") + 1] == "64"


def test_the_workers_file_names_every_role_a_worker_serves():
    import json

    from epd.launcher import workers_file_json

    infos = [{"role": "encoder", "address": "127.0.0.1:5001", "metrics_port": 9001},
             {"role": "colocated", "address": "127.0.0.1:5002", "metrics_port": 9002}]
    assert json.loads(workers_file_json(infos, "127.0.0.1")) == {"workers": [
        {"role": "encoder", "address": "127.0.0.1:5001", "metrics_url": "http://127.0.0.1:9001/metrics"},
        {"role": "encoder", "address": "127.0.0.1:5002", "metrics_url": "http://127.0.0.1:9002/metrics"},
        {"role": "prefill", "address": "127.0.0.1:5002", "metrics_url": "http://127.0.0.1:9002/metrics"},
        {"role": "decode", "address": "127.0.0.1:5002", "metrics_url": "http://127.0.0.1:9002/metrics"}]}


def test_the_router_starts_with_the_workers_and_learns_them_from_the_file(monkeypatch):
    """Spawned before any worker is ready (it loads meanwhile), it gets no addresses on its command
    line, and the file it reads is written once every worker is ready."""
    import json
    import shutil

    import pytest

    from epd.launcher import Cluster, ServeOptions

    class Started:
        def poll(self):
            return None

    class RouterStarting(Exception):
        pass

    cluster = Cluster(ServeOptions(model_dir="/m"))
    spawned: list[str] = []
    files_at_spawn: dict[str, bool] = {}

    def popen(name, args):
        spawned.append(name)
        files_at_spawn[name] = cluster.workers_file.exists()
        if name == "router":
            assert "--encoder" not in args and args[args.index("--workers-file") + 1] == str(cluster.workers_file)
        return Started()

    def wait_file(path):
        if path.stem == "router":
            raise RouterStarting
        return {"address": f"127.0.0.1:{len(spawned)}", "metrics_port": 1, "role": path.stem.split("-")[0]}

    monkeypatch.setattr(cluster, "_popen", popen)
    monkeypatch.setattr(cluster, "_wait_file", wait_file)
    try:
        with pytest.raises(RouterStarting):
            cluster.start()
        roles = [w["role"] for w in json.loads(cluster.workers_file.read_text())["workers"]]
    finally:
        shutil.rmtree(cluster.run_dir)
    assert spawned == ["encoder-0", "prefill-0", "decode-0", "router"] and not any(files_at_spawn.values())
    assert roles == ["encoder", "prefill", "decode"]
