"""The shm receiver maps the owner's segment privately instead of copying it: the tensors outlive the
owner's unlink, writes to them stay private, and no file descriptor is kept per fetched handle."""

from __future__ import annotations

import os

import torch

from epd.transfer.shm import map_private, segment_path
from tests.unit.transfer.helpers import assert_bit_equal, metas_of, my_segments, payload


def _fds_open_on(path: str) -> list[str]:
    """This process's descriptors on `path` (a deleted file reads as "PATH (deleted)"). Counting all
    descriptors instead is flaky in a suite: other tests' gRPC channels close at any moment."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed between the listing and the readlink
            continue
        if target.startswith(path):
            found.append(target)
    return found


def test_fetched_tensors_survive_the_release_and_stay_private(make_owner, receiver):
    owner = make_owner("shm")
    tensors = payload()
    handle = owner.publish(tensors, "kv", ttl_s=30.0)
    path = segment_path(owner.shm_dir, handle.shm_segment_name)
    got = receiver.fetch(handle, metas_of(tensors), "kv")
    assert _fds_open_on(path) == []  # mapped, then the descriptor closed
    assert receiver.wait_for_acks()
    assert not os.path.exists(path) and my_segments() == set()  # acked: the owner unlinked it
    assert _fds_open_on(path) == []
    assert_bit_equal(got, tensors)  # still readable after the unlink
    name, big = got[-1]
    big.fill_(7.0)  # copy-on-write: our write must not fail, nor show anywhere else
    assert torch.equal(big, torch.full_like(big, 7.0)) and name == "big"


def test_map_private_faults_pages_in_and_reports_a_missing_file(tmp_path):
    path = tmp_path / "epd-1-00000000000000ff"
    data = torch.arange(3 * 4096, dtype=torch.int32)
    path.write_bytes(data.numpy().tobytes())
    mapped = map_private(str(path), data.numel() * 4)
    path.unlink()
    assert torch.equal(mapped.view(torch.int32), data)
    try:
        map_private(str(path), 16)
    except FileNotFoundError as err:
        assert str(path) in str(err)
    else:
        raise AssertionError("mapping a missing segment must raise FileNotFoundError")
