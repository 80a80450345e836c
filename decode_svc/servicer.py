"""gRPC face of the decode worker: Decode streams one chunk per token; Cancel stops a stream."""

from __future__ import annotations

import grpc

from decode_svc.service import DecodeService, KvImport
from epd.deadlines import remaining_s
from epd.rpc_errors import InvalidInput
from epd.v1 import common_pb2, decode_pb2, decode_pb2_grpc
from epd.wire.sampling import sampling_from_pb

FINISH = {"stop": common_pb2.FINISH_REASON_STOP, "length": common_pb2.FINISH_REASON_LENGTH,
          "cancelled": common_pb2.FINISH_REASON_CANCELLED}


class DecodeServicer(decode_pb2_grpc.DecodeServicer):
    def __init__(self, service: DecodeService) -> None:
        self.service = service

    def Decode(self, request: decode_pb2.DecodeRequest, context: grpc.ServicerContext):
        timeout_s = remaining_s(request.deadline_ms, context.time_remaining(), self.service.config.decode_timeout_s)
        if not request.HasField("kv") or not request.kv.HasField("handle"):
            raise InvalidInput("DecodeRequest.kv with a transfer handle is required")
        kv = KvImport(handle=request.kv.handle, metas=list(request.kv.tensors), num_tokens=request.kv.num_tokens,
                      position_delta=request.kv.position_delta)
        steps = self.service.decode(request.request_id, kv, request.first_token_id,
                                    sampling_from_pb(request.sampling), tuple(request.sampling.stop_token_ids),
                                    timeout_s, context.is_active)
        for step in steps:
            chunk = decode_pb2.DecodeChunk(token_ids=[] if step.token is None else [step.token])
            if step.finish_reason:
                chunk.finish_reason = FINISH[step.finish_reason]
                chunk.usage.CopyFrom(common_pb2.Usage(prompt_tokens=kv.num_tokens,
                                                      completion_tokens=step.completion_tokens))
            yield chunk

    def Cancel(self, request: decode_pb2.CancelRequest, context: grpc.ServicerContext) -> decode_pb2.CancelResponse:
        return decode_pb2.CancelResponse(found=self.service.cancel(request.request_id))
