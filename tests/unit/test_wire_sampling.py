"""SamplingParams <-> common_pb2.SamplingParams: zero means default, seed presence, stop token ids, validation."""

from __future__ import annotations

import math

import pytest

from epd.engine.sampling import SamplingParams
from epd.v1 import common_pb2
from epd.wire.sampling import sampling_from_pb, sampling_to_pb
from router.chat_request import RequestLimits, parse_chat_request
from router.errors import RequestError

# Values exactly representable in float32, so the proto's `float` fields round-trip them bit for bit.
CUSTOM = SamplingParams(temperature=0.75, top_p=0.5, top_k=40, seed=1234, max_tokens=99, ignore_eos=True)


def test_all_zero_proto_gives_the_defaults():
    assert sampling_from_pb(common_pb2.SamplingParams()) == SamplingParams()


def test_zero_top_p_and_max_tokens_mean_default_but_zero_temperature_and_top_k_are_kept():
    params = sampling_from_pb(common_pb2.SamplingParams(temperature=0.0, top_p=0.0, top_k=0, max_tokens=0))
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (0.0, 1.0, 0, 16)
    assert params.greedy is True


def test_every_field_is_read():
    pb = common_pb2.SamplingParams(temperature=0.75, top_p=0.5, top_k=40, seed=1234, max_tokens=99, ignore_eos=True)
    assert sampling_from_pb(pb) == CUSTOM


def test_unset_seed_is_none():
    assert sampling_from_pb(common_pb2.SamplingParams(temperature=1.0)).seed is None


def test_seed_zero_is_a_seed_not_unset():
    pb = common_pb2.SamplingParams(seed=0)
    assert pb.HasField("seed")
    assert sampling_from_pb(pb).seed == 0


def test_negative_seed_is_carried():
    assert sampling_from_pb(common_pb2.SamplingParams(seed=-7)).seed == -7


def test_to_pb_sets_every_field():
    pb = sampling_to_pb(CUSTOM)
    assert (pb.temperature, pb.top_p, pb.top_k, pb.max_tokens, pb.ignore_eos) == (0.75, 0.5, 40, 99, True)
    assert pb.HasField("seed") and pb.seed == 1234
    assert list(pb.stop_token_ids) == []
    assert list(pb.stop) == []  # stop strings are the router's business, never sent to workers


def test_to_pb_without_seed_leaves_it_unset():
    assert sampling_to_pb(SamplingParams()).HasField("seed") is False


def test_to_pb_with_seed_zero_sets_it():
    pb = sampling_to_pb(SamplingParams(seed=0))
    assert pb.HasField("seed") and pb.seed == 0


def test_to_pb_carries_stop_token_ids_in_order():
    assert list(sampling_to_pb(SamplingParams(), stop_token_ids=(7, 3, 7)).stop_token_ids) == [7, 3, 7]


@pytest.mark.parametrize("params", [SamplingParams(), CUSTOM, SamplingParams(seed=0),
                                    SamplingParams(temperature=1.0, top_k=1, max_tokens=1),
                                    SamplingParams(seed=-(2**63)), SamplingParams(seed=2**63 - 1)])
def test_round_trip(params):
    assert sampling_from_pb(sampling_to_pb(params)) == params


def test_round_trip_through_bytes():
    wire = sampling_to_pb(CUSTOM, stop_token_ids=(5,)).SerializeToString()
    pb = common_pb2.SamplingParams.FromString(wire)
    assert sampling_from_pb(pb) == CUSTOM
    assert list(pb.stop_token_ids) == [5]


def test_float32_wire_rounds_temperature():
    params = sampling_from_pb(sampling_to_pb(SamplingParams(temperature=0.7)))
    assert params.temperature != 0.7  # documented: the proto field is a float32
    assert params.temperature == pytest.approx(0.7, rel=1e-6)


@pytest.mark.parametrize("pb, message", [
    (common_pb2.SamplingParams(temperature=-0.5), "temperature must be >= 0, got -0.5"),
    (common_pb2.SamplingParams(top_p=1.5), "top_p must be in (0, 1], got 1.5"),
    (common_pb2.SamplingParams(top_p=-0.25), "top_p must be in (0, 1], got -0.25"),
    (common_pb2.SamplingParams(top_k=-1), "top_k must be >= 0 (0 disables it), got -1"),
    (common_pb2.SamplingParams(max_tokens=-3), "max_tokens must be >= 1, got -3"),
])
def test_invalid_values_raise_value_error_naming_them(pb, message):
    with pytest.raises(ValueError) as info:
        sampling_from_pb(pb)
    assert str(info.value) == message


def test_nan_temperature_raises_value_error():
    with pytest.raises(ValueError, match="temperature"):
        sampling_from_pb(common_pb2.SamplingParams(temperature=math.nan))


def test_nan_top_p_raises_value_error():
    with pytest.raises(ValueError, match="top_p"):
        sampling_from_pb(common_pb2.SamplingParams(top_p=math.nan))


def test_every_seed_the_chat_parser_accepts_fits_the_wire():
    chat = parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "seed": 2**63 - 1},
                              limits=RequestLimits())
    assert sampling_from_pb(sampling_to_pb(chat.sampling)).seed == 2**63 - 1
    with pytest.raises(RequestError) as caught:
        parse_chat_request({"messages": [{"role": "user", "content": "hi"}], "seed": 2**63}, limits=RequestLimits())
    assert caught.value.param == "seed"
