"""Behaviour of the generated epd.v1 messages that the services rely on.

Contract rules (up-to-date code, comments, enum zeros, no float lists) are in test_protos_generated.py.
"""

from __future__ import annotations

from epd.v1 import common_pb2, router_pb2


def test_generate_response_is_a_oneof_of_chunk_complete_error():
    oneof = router_pb2.GenerateResponse.DESCRIPTOR.oneofs_by_name["event"]
    assert [f.name for f in oneof.fields] == ["chunk", "complete", "error"]


def test_seed_has_presence():
    params = common_pb2.SamplingParams()
    assert not params.HasField("seed")
    params.seed = 0
    assert params.HasField("seed")
