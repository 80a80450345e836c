"""The OpenAI-compatible HTTP gateway (FastAPI): chat completions, models, health, readiness,
metrics and the worker list. Every error body has OpenAI's shape."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from epd import metrics
from router.admission import Admission, RequestScope
from router.chat_request import ChatRequest, RequestLimits, parse_chat_request
from router.completion import Delta, Final, stream_completion
from router.errors import RequestError, error_body, http_status_for
from router.frontend import Frontend
from router.limits import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, parse_json_body, read_body_capped
from router.openai_format import chunk, completion_body, usage_chunk
from router.openapi_schema import openapi_extra
from router.orchestrator import Job, Orchestrator, UpstreamError
from router.security import ApiKeyMiddleware
from router.workers import ROLES, WorkerRegistry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Gateway:
    """Everything a request handler needs; built once at start-up."""

    model_name: str
    registry: WorkerRegistry
    orchestrator: Orchestrator
    frontend: Frontend
    limits: RequestLimits
    admission: Admission  # shared by the HTTP and gRPC front ends
    discovery: list = field(default_factory=list)  # DNS / file sources feeding the registry (router.discovery)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # also the gRPC Router's receive limit
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    api_key: str | None = None  # None: no key needed (router.security)


def create_app(gateway: Gateway, lifespan=None) -> FastAPI:
    app = FastAPI(title="EPD cluster router", lifespan=lifespan)
    app.state.gateway = gateway
    if gateway.api_key is not None:
        app.add_middleware(ApiKeyMiddleware, api_key=gateway.api_key)

    @app.exception_handler(RequestError)
    async def _request_error(_, exc: RequestError):
        return _error(exc.status, exc.message, exc.type, exc.param, exc.code)

    @app.exception_handler(Exception)
    async def _internal_error(_, exc: Exception):
        # Still the server's fault, but in the shape clients parse, and logged with its traceback.
        log.exception("unhandled error in a request handler", exc_info=exc)
        return _error(500, f"internal error: {type(exc).__name__}", "internal_error")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error(exc.status_code, str(exc.detail), kind)

    @app.post("/v1/chat/completions", openapi_extra=openapi_extra(gateway.limits, gateway.model_name))
    async def chat_completions(request: Request):
        return await _chat(gateway, request)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": gateway.model_name, "object": "model", "created": 0,
                                            "owned_by": "epd"}]}

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        roles = {role: len(gateway.registry.ready(role)) for role in ROLES}
        ok = gateway.registry.is_ready()
        return JSONResponse({"ready": ok, "ready_workers": roles}, status_code=200 if ok else 503)

    @app.get("/workers")
    async def workers():
        return {"workers": gateway.registry.snapshot()}

    @app.get("/metrics")
    async def prometheus():
        return PlainTextResponse(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    return app


# Saturated (429) or without a live worker (503): when to come back, as RFC 9110 says a server may.
RETRY_AFTER_S = 1


def _error(status: int, message: str, kind: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status in (429, 503) else None
    return JSONResponse(error_body(message, kind, param, code), status_code=status, headers=headers)


def _upstream_error(exc: UpstreamError) -> JSONResponse:
    status, kind = http_status_for(exc.code)
    return _error(status, exc.message, kind, code=exc.code.name.lower())


async def _chat(gateway: Gateway, request: Request):
    if not gateway.admission.try_enter():
        metrics.REQUESTS.labels("router", "resource_exhausted").inc()
        return _error(429, f"the router is already working on {gateway.admission.limit} requests; retry later",
                      "rate_limit_error", code="too_many_requests")
    scope = RequestScope(gateway.admission, lambda status: metrics.REQUESTS.labels("router", status).inc())
    try:
        chat, job = await _prepare(gateway, request)
        scope.events = stream_completion(gateway.orchestrator, gateway.frontend.tokenizer, job, chat.stop,
                                         gateway.frontend.offload)
        first = await anext(scope.events)  # errors before the first token still get a proper HTTP status
    except RequestError:
        await scope.close("invalid_argument")
        raise
    except UpstreamError as exc:
        await scope.close(exc.code.name.lower())
        return _upstream_error(exc)
    except BaseException:
        await scope.close("error")
        raise
    if chat.stream:
        # The background task closes the scope even if the client leaves before the body starts.
        return StreamingResponse(_sse(gateway, chat, job, first, scope), media_type="text/event-stream",
                                 background=BackgroundTask(scope.close, "cancelled"))
    return await _collect_unless_gone(request, _collect(gateway, chat, job, first, scope), scope)


async def _collect_unless_gone(request: Request, collect, scope: RequestScope, poll_s: float = 0.5):
    """Run a non-streaming completion, cancelling it (and so the decode) if the client disconnects."""
    task = asyncio.ensure_future(collect)
    while not task.done():
        await asyncio.wait({task}, timeout=poll_s)
        if not task.done() and await request.is_disconnected():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await scope.close("cancelled")
            return _error(499, "the client closed the connection", "cancelled")
    return task.result()


async def _prepare(gateway: Gateway, request: Request) -> tuple[ChatRequest, Job]:
    raw = await read_body_capped(request.stream(), request.headers.get("content-length"), gateway.max_body_bytes,
                                 gateway.body_timeout_s)
    chat = await gateway.frontend.offload.run(_parse_body, raw, gateway.limits)
    if chat.model and chat.model != gateway.model_name:
        raise RequestError(f"the model {chat.model!r} does not exist; this server serves {gateway.model_name!r}",
                           status=404, type="not_found_error", param="model", code="model_not_found")
    return chat, await gateway.frontend.prepare(chat)


def _parse_body(raw: bytes, limits: RequestLimits) -> ChatRequest:
    return parse_chat_request(parse_json_body(raw), limits=limits)


async def _collect(gateway: Gateway, chat: ChatRequest, job: Job, first, scope: RequestScope) -> JSONResponse:
    text, ids, status = [], [], "error"
    try:
        item = first
        while not isinstance(item, Final):
            text.append(item.text)
            ids.extend(item.token_ids)
            item = await anext(scope.events)
        status = "ok"
        return JSONResponse(completion_body(job.request_id, gateway.model_name, "".join(text), ids, item,
                                            job.prompt_ids if chat.return_token_ids else None))
    except UpstreamError as exc:
        status = exc.code.name.lower()
        return _upstream_error(exc)
    except asyncio.CancelledError:
        status = "cancelled"
        raise
    finally:
        await scope.close(status)


async def _sse(gateway: Gateway, chat: ChatRequest, job: Job, first, scope: RequestScope) -> AsyncIterator[str]:
    created, name, rid = int(time.time()), gateway.model_name, job.request_id
    ids = [] if chat.return_token_ids else None
    status = "cancelled"
    try:
        yield _data(chunk(rid, name, created, {"role": "assistant", "content": ""},
                          prompt_token_ids=job.prompt_ids if ids is not None else None))
        item = first
        while isinstance(item, Delta):
            yield _data(chunk(rid, name, created, {"content": item.text}, token_ids=item.token_ids if ids is not None
                              else None))
            item = await anext(scope.events)
        yield _data(chunk(rid, name, created, {}, finish_reason=item.finish_reason))
        if chat.include_usage:
            yield _data(usage_chunk(rid, name, created, item))
        status = "ok"
    except UpstreamError as exc:
        status = exc.code.name.lower()
        _, kind = http_status_for(exc.code)
        yield _data(error_body(exc.message, kind, None, exc.code.name.lower()))
    finally:
        await scope.close(status)
    yield "data: [DONE]\n\n"


def _data(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"
