"""--cpu-affinity: parsing and the auto plan, on exact CPU sets."""

from __future__ import annotations

import pytest

from epd.cpu_affinity import parse_cpu_list, parse_spec, plan_affinity
from epd.launcher import ServeOptions, child_environment

CLUSTER = [("encoder-0", "encoder"), ("prefill-0", "prefill"), ("decode-0", "decode"), ("router", "router")]


def test_cpu_lists():
    assert parse_cpu_list("3") == (3,)
    assert parse_cpu_list("0-2+5") == (0, 1, 2, 5)
    assert parse_cpu_list("2+1+2") == (1, 2)


@pytest.mark.parametrize("bad", ["", "a", "3-1", "-1", "1-"])
def test_bad_cpu_lists_are_refused(bad):
    with pytest.raises(ValueError, match="CPU"):
        parse_cpu_list(bad)


def test_spec_by_role():
    assert parse_spec("decode=1,encoder=0") == {"decode": (1,), "encoder": (0,)}
    with pytest.raises(ValueError, match="ROLE=CPUS"):
        parse_spec("gpu=1")
    with pytest.raises(ValueError, match="ROLE=CPUS"):
        parse_spec("decode")


def test_auto_on_two_cpus_gives_decode_its_own():
    plan = plan_affinity("auto", CLUSTER, [0, 1])
    assert plan == {"encoder-0": (0,), "prefill-0": (0,), "router": (0,), "decode-0": (1,)}


def test_auto_on_eight_cpus_splits_decode_workers():
    procs = CLUSTER[:2] + [("decode-0", "decode"), ("decode-1", "decode"), ("router", "router")]
    plan = plan_affinity("auto", procs, list(range(8)))
    assert plan["decode-0"] == (4, 5) and plan["decode-1"] == (6, 7)
    assert plan["encoder-0"] == plan["router"] == (0, 1, 2, 3)


def test_auto_with_more_decode_workers_than_cpus_shares_them():
    procs = [("decode-0", "decode"), ("decode-1", "decode"), ("decode-2", "decode"), ("router", "router")]
    plan = plan_affinity("auto", procs, [0, 1, 2])
    assert plan["decode-0"] == (1,) and plan["decode-1"] == (2,) and plan["decode-2"] == (1,)


def test_auto_on_one_cpu_or_colocated_pins_nothing_apart():
    assert plan_affinity("auto", CLUSTER, [0]) == {name: (0,) for name, _ in CLUSTER}
    colocated = [("colocated-0", "colocated"), ("router", "router")]
    assert plan_affinity("auto", colocated, [0, 1]) == {"colocated-0": (0, 1), "router": (0, 1)}


def test_explicit_spec_leaves_unnamed_roles_on_every_cpu():
    plan = plan_affinity("decode=1", CLUSTER, [0, 1])
    assert plan["decode-0"] == (1,) and plan["encoder-0"] == (0, 1)
    with pytest.raises(ValueError, match="does not offer"):
        plan_affinity("decode=7", CLUSTER, [0, 1])


def test_serve_options_list_processes_and_check_the_spec():
    assert [n for n, _ in ServeOptions("m", decodes=2).processes()] == [
        "encoder-0", "prefill-0", "decode-0", "decode-1", "router"]
    assert ServeOptions("m", colocated=True).processes() == [("colocated-0", "colocated"), ("router", "router")]
    with pytest.raises(ValueError):
        ServeOptions("m", cpu_affinity="decode=x")


def test_pinned_children_run_one_thread_per_cpu():
    assert child_environment({}, (1,))["OMP_NUM_THREADS"] == "1"
    assert child_environment({"OMP_NUM_THREADS": "4"}, (1,))["OMP_NUM_THREADS"] == "4"
    assert "OMP_NUM_THREADS" not in child_environment({})


def test_long_calls_leave_threads_for_short_ones():
    import argparse

    from epd.worker_args import SHORT_CALL_THREADS, worker_options

    args = argparse.Namespace(host="127.0.0.1", port=0, metrics_port=0, ready_file=None, threads=0,
                              otlp_endpoint=None)
    options = worker_options(args, long_calls=64)
    assert options.threads == 64 + SHORT_CALL_THREADS
    assert options.max_concurrent_rpcs > options.threads  # short calls queue for a thread, never refused
