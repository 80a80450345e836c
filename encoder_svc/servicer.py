"""gRPC face of the encoder: decode the proto, call EncoderService.encode, encode the reply."""

from __future__ import annotations

import grpc

from encoder_svc.service import EncoderService, ImageRequest, LeasedEmbedding
from epd.deadlines import remaining_s
from epd.rpc_errors import InvalidInput
from epd.transfer.undelivered import release_if_undelivered
from epd.v1 import common_pb2, encoder_pb2, encoder_pb2_grpc
from epd.wire.tensors import meta_of


class EncoderServicer(encoder_pb2_grpc.EncoderServicer):
    def __init__(self, service: EncoderService, max_images_per_request: int = 64) -> None:
        self.service = service
        self.max_images = max_images_per_request

    def Encode(self, request: encoder_pb2.EncodeRequest, context: grpc.ServicerContext) -> encoder_pb2.EncodeResponse:
        if not request.images:
            raise InvalidInput("EncodeRequest.images is empty")
        if len(request.images) > self.max_images:
            raise InvalidInput(f"{len(request.images)} images in one request; the limit is {self.max_images}")
        timeout_s = remaining_s(request.deadline_ms, context.time_remaining(), self.service.config.encode_timeout_s)
        images = [ImageRequest(im.data, im.image_digest) for im in request.images]
        leased = self.service.encode(images, timeout_s, context.is_active)
        # If the router has left (now or as the reply goes), nobody will pull them.
        release_if_undelivered(context, self.service.sender, [e.handle.handle_id for e in leased])
        return encoder_pb2.EncodeResponse(embeddings=[to_pb(e) for e in leased])


def to_pb(leased: LeasedEmbedding) -> common_pb2.EmbeddingRef:
    return common_pb2.EmbeddingRef(
        image_digest=leased.key,
        num_image_tokens=leased.image.num_tokens,
        tensors=[meta_of(name, t) for name, t in leased.image.tensors.items()],
        grid_thw=list(leased.image.grid_thw),
        handle=leased.handle,
    )

