"""SamplingParams between the domain dataclass and the proto, where zero values mean "default"."""

from __future__ import annotations

from epd.engine.params import SamplingParams
from epd.v1 import common_pb2


def sampling_from_pb(pb: common_pb2.SamplingParams) -> SamplingParams:
    """InvalidInput (→ INVALID_ARGUMENT) names the offending value."""
    from epd.rpc_errors import InvalidInput

    try:
        return _sampling(pb)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def _sampling(pb: common_pb2.SamplingParams) -> SamplingParams:
    return SamplingParams(
        temperature=pb.temperature,
        top_p=pb.top_p or 1.0,
        top_k=pb.top_k,
        seed=pb.seed if pb.HasField("seed") else None,
        max_tokens=pb.max_tokens or SamplingParams.max_tokens,
        ignore_eos=pb.ignore_eos,
    )


def sampling_to_pb(params: SamplingParams, stop_token_ids: tuple[int, ...] = ()) -> common_pb2.SamplingParams:
    pb = common_pb2.SamplingParams(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                                   max_tokens=params.max_tokens, ignore_eos=params.ignore_eos,
                                   stop_token_ids=list(stop_token_ids))
    if params.seed is not None:
        pb.seed = params.seed
    return pb
