"""`epd ray`'s pure decisions: what each worker runs, who drains first, what the router reads."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from epd.cli import build_parser
from epd.ray_cluster.actors import spec_from_dict
from epd.ray_cluster.cli import spec_from_args
from epd.ray_cluster.plan import (
    Member,
    RayClusterSpec,
    ScalePlan,
    advertised_host,
    member_from_ready,
    plan_scale,
    workers_file_text,
)


def test_scaling_up_starts_the_difference_and_down_drains_the_newest_first():
    assert plan_scale(["decode-0"], 3) == ScalePlan(start=2)
    assert plan_scale(["decode-0", "decode-1"], 2) == ScalePlan()
    assert plan_scale(["decode-0", "decode-2", "decode-5"], 1) == ScalePlan(drain=["decode-5", "decode-2"])


@pytest.mark.parametrize("kwargs, message", [
    ({"decodes": 0}, "decode replicas must be between 1 and 64"),
    ({"encoders": 65}, "encoder replicas must be between 1 and 64"),
    ({"cpus_per_worker": -1}, "--cpus-per-worker"),
    ({"transfer": "nccl"}, "--transfer must be grpc or shm"),
    ({"transfer": "shm", "worker_host": "node-ip"}, "--transfer shm needs every worker on one host"),
    ({"worker_host": "0.0.0.0"}, "--worker-host must be an address peers can reach"),
])
def test_bad_specs_are_refused_with_the_flag_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RayClusterSpec(model_dir="/m", **kwargs)


def test_gpus_per_worker_default_to_one_only_where_the_cluster_has_gpus():
    assert RayClusterSpec(model_dir="/m").gpus(0) == 0
    assert RayClusterSpec(model_dir="/m").gpus(8) == 1
    assert RayClusterSpec(model_dir="/m", gpus_per_worker=0.5).gpus(8) == 0.5


def test_worker_commands_carry_the_role_s_flags_only():
    spec = RayClusterSpec(model_dir="/m", transfer="shm", worker_args=("--kv-blocks", "64", "--kernels", "torch"),
                          otlp_endpoint="127.0.0.1:4317")
    encoder = spec.worker_command("encoder", "/r/e.json")
    decode = spec.worker_command("decode", "/r/d.json")
    assert encoder[:3] == ["encoder", "--model", "/m"] and "--kv-blocks" not in encoder
    assert encoder[encoder.index("--transfer") + 1] == "shm"
    assert encoder[encoder.index("--kernels") + 1] == "torch"  # the vision tower's kernels
    assert "--transfer" not in decode and decode[decode.index("--kv-blocks") + 1] == "64"
    assert decode[decode.index("--kernels") + 1] == "torch"
    for command in (encoder, decode):
        assert command[command.index("--port") + 1] == "0"  # the ready file says which port
        assert command[command.index("--otlp-endpoint") + 1] == "127.0.0.1:4317"
    router = spec.router_command("/r/workers.json", "/r/router.json")
    assert router[router.index("--workers-file") + 1] == "/r/workers.json"


def test_node_ip_workers_bind_and_are_routed_at_their_node_s_ip():
    spec = RayClusterSpec(model_dir="/m", worker_host="node-ip")
    command = spec.worker_command("decode", "/r/d.json")
    assert command[command.index("--host") + 1] == "{node_ip}"  # the actor fills in its node's IP
    info = {"role": "decode", "address": "10.0.0.7:7003", "metrics_port": 9103}
    assert member_from_ready("decode-1", info, "10.0.0.7", "node-ip") == Member(
        "decode-1", "decode", "10.0.0.7:7003", "http://10.0.0.7:9103/metrics")
    assert member_from_ready("decode-1", {**info, "address": "[fd00::7]:7003"}, "fd00::7",
                             "node-ip").address == "[fd00::7]:7003"
    assert advertised_host("127.0.0.1", "10.0.0.7") == "127.0.0.1"


def test_the_workers_file_is_what_the_router_s_file_discovery_reads():
    members = [Member("prefill-0", "prefill", "h:2", "http://h:9/metrics"), Member("decode-1", "decode", "h:1", "")]
    workers = json.loads(workers_file_text(members))["workers"]
    assert [(w["role"], w["address"], w["metrics_url"]) for w in workers] == [
        ("decode", "h:1", ""), ("prefill", "h:2", "http://h:9/metrics")]


def test_the_spec_survives_the_trip_to_the_controller_actor():
    spec = RayClusterSpec(model_dir="/m", decodes=3, worker_args=("--max-running", "8"), allow_url_hosts=("a",))
    assert spec_from_dict(json.loads(json.dumps(asdict(spec)))) == spec


def test_epd_ray_up_flags_become_the_spec():
    args = build_parser().parse_args(["ray", "up", "--model", "/m", "--decodes", "2", "--max-running", "16",
                                      "--worker-host", "node-ip", "--gpus-per-worker", "1"])
    spec = spec_from_args(args)
    assert (spec.decodes, spec.worker_args, spec.worker_host, spec.gpus_per_worker) == (
        2, ("--max-running", "16"), "node-ip", 1.0)
