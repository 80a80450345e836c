"""The nccl backend on gloo (no CUDA here): a pair's group is made once and reused, an error drops it on
both sides and the next fetch makes a new one, and the wire carries only what the side channel says."""

from __future__ import annotations

import time

import grpc
import pytest

from epd.transfer import TransferError
from epd.transfer.groups import choose_backend, local_backends
from epd.transfer.pairs import MAX_TAG, Pair
from tests.unit.transfer.helpers import assert_bit_equal, metas_of, payload


def test_group_is_made_once_and_reused(make_owner, receiver):
    owner = make_owner("nccl")
    tensors = payload()
    for _ in range(3):
        got = receiver.fetch(owner.publish(tensors, "kv", ttl_s=30.0), metas_of(tensors), "kv")
        assert_bit_equal(got, tensors)
    assert receiver.group_backend(owner.owner_address) == "gloo"
    assert len(owner.pairs()._pairs) == 1


def test_an_unknown_handle_drops_the_group_and_the_next_fetch_makes_a_new_one(make_owner, receiver):
    owner = make_owner("nccl")
    tensors = payload()[:3]
    receiver.fetch(owner.publish(tensors, "kv", ttl_s=30.0), metas_of(tensors), "kv")
    first = receiver._pairs._pairs[owner.owner_address]
    handle = owner.publish(tensors, "kv", ttl_s=30.0)
    owner.release(handle.handle_id)
    with pytest.raises(TransferError) as info:
        receiver.fetch(handle, metas_of(tensors), "kv")
    assert info.value.code == grpc.StatusCode.NOT_FOUND and owner.owner_address in str(info.value)
    assert receiver.group_backend(owner.owner_address) is None and len(owner.pairs()._pairs) == 0
    got = receiver.fetch(owner.publish(tensors, "kv", ttl_s=30.0), metas_of(tensors), "kv")
    assert_bit_equal(got, tensors)
    assert receiver._pairs._pairs[owner.owner_address] is not first


def test_backend_choice_and_tags():
    assert local_backends()[-1] == "gloo"
    assert choose_backend(["gloo"]) == "gloo"
    assert choose_backend(["mpi"]) is None
    pair = Pair("g", "gloo", store=None)
    assert pair.take_tags(3) == 0 and pair.take_tags(2) == 3
    pair.next_tag = MAX_TAG - 1
    assert pair.take_tags(4) == 0  # wraps before passing the largest tag


def test_the_puller_binds_the_address_on_its_route_to_the_owner():
    from epd.transfer.pairs import local_address_towards

    assert local_address_towards("127.0.0.1", 9) == "127.0.0.1"


def test_owner_pairs_are_bounded_and_a_puller_that_never_joins_is_forgotten():
    from epd.transfer.pairs import OwnerPairs

    pairs = OwnerPairs("127.0.0.1", timeout_s=0.5, max_pairs=2)
    ids = [pairs.rendezvous(["gloo"])[0] for _ in range(3)]
    assert len(pairs._pairs) == 2 and ids[0] not in pairs._pairs  # the oldest is dropped beyond the bound
    started = time.monotonic()
    assert pairs.get(ids[2]) is None  # nobody joined within the timeout: no pair
    while ids[2] in pairs._pairs and time.monotonic() - started < 15:  # the join thread gives up, bounded
        time.sleep(0.05)
    assert ids[2] not in pairs._pairs
    pairs.close()
    assert not pairs._pairs


def test_a_group_the_owner_dropped_is_replaced_within_the_same_fetch(make_owner, receiver):
    owner = make_owner("nccl")
    tensors = payload()[:3]
    receiver.fetch(owner.publish(tensors, "kv", ttl_s=30.0), metas_of(tensors), "kv")
    [group_id] = list(owner.pairs()._pairs)
    owner.pairs().drop(group_id)  # e.g. evicted by other pullers
    got = receiver.fetch(owner.publish(tensors, "kv", ttl_s=30.0), metas_of(tensors), "kv")
    assert_bit_equal(got, tensors)
    assert list(owner.pairs()._pairs) != [group_id] and len(owner.pairs()._pairs) == 1
