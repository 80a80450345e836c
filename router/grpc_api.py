"""`epd.v1.Router/Generate`: the same semantics as the HTTP gateway, over gRPC.

The request is mapped onto the OpenAI body shape and validated by the same parser, so both front
ends accept and refuse exactly the same things.
"""

from __future__ import annotations

import base64

import grpc

from epd import metrics
from epd.v1 import common_pb2, router_pb2, router_pb2_grpc
from router.admission import RequestScope
from router.chat_request import parse_chat_request
from router.completion import Delta, Final, stream_completion
from router.errors import RequestError
from router.orchestrator import UpstreamError
from router.security import grpc_key_matches

ROLE_NAMES = {router_pb2.ROLE_SYSTEM: "system", router_pb2.ROLE_USER: "user", router_pb2.ROLE_ASSISTANT: "assistant"}
FINISH = {"stop": common_pb2.FINISH_REASON_STOP, "length": common_pb2.FINISH_REASON_LENGTH}
ERROR_CODES = {grpc.StatusCode.INVALID_ARGUMENT: common_pb2.ERROR_CODE_INVALID_ARGUMENT,
               grpc.StatusCode.RESOURCE_EXHAUSTED: common_pb2.ERROR_CODE_RESOURCE_EXHAUSTED,
               grpc.StatusCode.UNAVAILABLE: common_pb2.ERROR_CODE_UNAVAILABLE,
               grpc.StatusCode.DEADLINE_EXCEEDED: common_pb2.ERROR_CODE_DEADLINE_EXCEEDED,
               grpc.StatusCode.CANCELLED: common_pb2.ERROR_CODE_CANCELLED,
               grpc.StatusCode.NOT_FOUND: common_pb2.ERROR_CODE_NOT_FOUND}


def request_body(request: router_pb2.GenerateRequest) -> dict:
    """The OpenAI-shaped body equivalent to a GenerateRequest (zero sampling values mean defaults)."""
    messages = [{"role": ROLE_NAMES.get(m.role, f"role#{m.role}"), "content": [_part(p) for p in m.content]}
                for m in request.messages]
    body: dict = {"messages": messages, "return_token_ids": request.return_token_ids}
    s = request.sampling
    body["temperature"] = s.temperature
    if s.top_p:
        body["top_p"] = s.top_p
    if s.top_k:
        body["top_k"] = s.top_k
    if s.HasField("seed"):
        body["seed"] = s.seed
    if s.max_tokens:
        body["max_tokens"] = s.max_tokens
    if s.ignore_eos:
        body["ignore_eos"] = True
    if s.stop:
        body["stop"] = list(s.stop)
    return body


def _part(part: router_pb2.ContentPart) -> dict:
    kind = part.WhichOneof("part")
    if kind == "text":
        return {"type": "text", "text": part.text}
    if kind == "image_url":
        return {"type": "image_url", "image_url": {"url": part.image_url}}
    if kind == "image_bytes":
        # The bytes go through the same loader as a data URL, so the same limits apply.
        return {"type": "image_url", "image_url": {"url": "data:image/unknown;base64,"
                                                   + base64.b64encode(part.image_bytes).decode()}}
    return {"type": "empty"}


class RouterServicer(router_pb2_grpc.RouterServicer):
    def __init__(self, gateway) -> None:
        self.gateway = gateway

    async def Generate(self, request: router_pb2.GenerateRequest, context: grpc.aio.ServicerContext):
        g = self.gateway
        if not grpc_key_matches(context.invocation_metadata(), g.api_key):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "incorrect or missing API key: send 'authorization: Bearer <key>' metadata")
        if not g.admission.try_enter():
            metrics.REQUESTS.labels("router", "resource_exhausted").inc()
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"the router is already working on {g.admission.limit} requests; retry later")
        scope = RequestScope(g.admission, lambda status: metrics.REQUESTS.labels("router", status).inc())
        status, sent = "cancelled", False  # a client that leaves mid-stream is counted as cancelled
        try:
            try:
                chat = await g.frontend.offload.run(_parse, request, g.limits)  # base64 of image bytes: CPU work
                job = await g.frontend.prepare(chat)
            except RequestError as exc:
                status = "invalid_argument"
                where = f"{exc.param}: " if exc.param else ""
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, where + exc.message)
            scope.events = stream_completion(g.orchestrator, g.frontend.tokenizer, job, chat.stop, g.frontend.offload)
            async for item in scope.events:
                sent = sent or isinstance(item, Delta)
                yield to_pb(item, chat.return_token_ids)
            status = "ok"
        except UpstreamError as exc:
            status = exc.code.name.lower()
            if not sent:  # before the first token: a plain status the client can retry on
                await context.abort(exc.code, exc.message)
            yield router_pb2.GenerateResponse(error=common_pb2.ErrorDetail(
                code=ERROR_CODES.get(exc.code, common_pb2.ERROR_CODE_INTERNAL), message=exc.message))
        finally:
            await scope.close(status)


def _parse(request: router_pb2.GenerateRequest, limits):
    return parse_chat_request(request_body(request), limits=limits)


def to_pb(item: Delta | Final, return_token_ids: bool) -> router_pb2.GenerateResponse:
    if isinstance(item, Delta):
        return router_pb2.GenerateResponse(chunk=router_pb2.GenerateResponse.Chunk(
            text=item.text, token_ids=item.token_ids if return_token_ids else []))
    return router_pb2.GenerateResponse(complete=router_pb2.GenerateResponse.Complete(
        finish_reason=FINISH[item.finish_reason],
        usage=common_pb2.Usage(prompt_tokens=item.prompt_tokens, completion_tokens=item.completion_tokens)))
