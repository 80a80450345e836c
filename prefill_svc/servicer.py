"""gRPC face of the prefill worker: decode the proto, call PrefillService.prefill, encode the reply."""

from __future__ import annotations

import grpc

from epd.deadlines import remaining_s
from epd.rpc_errors import InvalidInput
from epd.transfer.undelivered import release_if_undelivered
from epd.v1 import common_pb2, prefill_pb2, prefill_pb2_grpc
from epd.wire.sampling import sampling_from_pb
from epd.wire.tensors import meta_of, tensor_from_proto
from prefill_svc.service import ImageEmbedding, PrefillResult, PrefillService

FINISH = {"stop": common_pb2.FINISH_REASON_STOP, "length": common_pb2.FINISH_REASON_LENGTH}


class PrefillServicer(prefill_pb2_grpc.PrefillServicer):
    def __init__(self, service: PrefillService) -> None:
        self.service = service

    def Prefill(self, request: prefill_pb2.PrefillRequest, context: grpc.ServicerContext
                ) -> prefill_pb2.PrefillResponse:
        timeout_s = remaining_s(request.deadline_ms, context.time_remaining(), self.service.config.prefill_timeout_s)
        if len(request.mm_positions) != len(request.embeddings):
            raise InvalidInput(f"{len(request.embeddings)} embeddings but {len(request.mm_positions)} mm_positions")
        images = [image_from_pb(ref, start) for ref, start in zip(request.embeddings, request.mm_positions,
                                                                  strict=True)]
        result = self.service.prefill(request.request_id, list(request.token_ids), images,
                                      sampling_from_pb(request.sampling), tuple(request.sampling.stop_token_ids),
                                      timeout_s, context.is_active)
        if result.kv_handle is not None:  # if the router has left (now or as the reply goes), nobody will pull it
            release_if_undelivered(context, self.service.sender, [result.kv_handle.handle_id])
        return to_pb(request.request_id, result)


def image_from_pb(ref: common_pb2.EmbeddingRef, start: int) -> ImageEmbedding:
    if len(ref.grid_thw) != 3:
        raise InvalidInput(f"image {ref.image_digest[:12]}: grid_thw must have 3 entries, got {list(ref.grid_thw)}")
    inline = {t.meta.name: tensor_from_proto(t) for t in ref.inline_tensors} if ref.inline_tensors else None
    if inline is None and not ref.HasField("handle"):
        raise InvalidInput(f"image {ref.image_digest[:12]}: neither a transfer handle nor inline tensors")
    if not ref.image_digest:
        raise InvalidInput("an embedding has no image_digest")
    return ImageEmbedding(digest=ref.image_digest, num_tokens=ref.num_image_tokens,
                          grid_thw=tuple(int(x) for x in ref.grid_thw), metas=list(ref.tensors),
                          handle=ref.handle if ref.HasField("handle") else None, inline=inline, start=start)


def to_pb(request_id: str, result: PrefillResult) -> prefill_pb2.PrefillResponse:
    response = prefill_pb2.PrefillResponse(first_token_id=result.first_token, prompt_tokens=result.prompt_tokens,
                                           finish_reason=FINISH.get(result.finish_reason,
                                                                    common_pb2.FINISH_REASON_UNSPECIFIED))
    if result.kv_handle is not None:
        response.kv.CopyFrom(common_pb2.KvRef(
            request_id=request_id, num_tokens=result.prompt_tokens, block_size=result.block_size,
            num_layers=len(result.kv_tensors) // 2, tensors=[meta_of(n, t) for n, t in result.kv_tensors],
            handle=result.kv_handle, position_delta=result.position_delta))
    return response
