"""One request across the workers: Encode (affinity by image digest) → expand placeholders →
Prefill (least outstanding) → Decode (least outstanding, streamed).

Retries go to another worker only before the first token exists and only for failures that mean
"this worker could not take it" (UNAVAILABLE, RESOURCE_EXHAUSTED). After it, a decode worker that
dies mid-stream is survived by migration: the prompt plus the tokens sent so far are prefilled
again and decoding goes on elsewhere (a bounded number of times); any other failure reaches the
client as an error. Closing the event stream (client gone, stop string) cancels the decode call.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc

from epd import tracing
from epd.deadlines import deadline_ms_in
from epd.engine.params import SamplingParams
from epd.engine.placeholders import expand_placeholders
from epd.rpc_errors import FAILED_PEER_KEY
from epd.v1 import (
    common_pb2,
    decode_pb2,
    decode_pb2_grpc,
    encoder_pb2,
    encoder_pb2_grpc,
    prefill_pb2,
    prefill_pb2_grpc,
    transfer_pb2,
    transfer_pb2_grpc,
)
from epd.wire.sampling import sampling_to_pb
from router.policies import NoWorkerAvailable, make_policy
from router.workers import Worker, WorkerRegistry

log = logging.getLogger(__name__)
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
# A decode stream that failed like this lost its worker, not its request: migrate it (see _start_decode).
MIGRATABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED, grpc.StatusCode.UNKNOWN)
FINISH = {common_pb2.FINISH_REASON_STOP: "stop", common_pb2.FINISH_REASON_LENGTH: "length",
          common_pb2.FINISH_REASON_CANCELLED: "cancelled"}


class UpstreamError(Exception):
    """A worker (or the lack of one) failed the request; `code` is the gRPC status to report."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class ImagePart:
    data: bytes  # the encoded file as the client sent it
    pixel_digest: str


@dataclass(frozen=True)
class Job:
    request_id: str
    prompt_ids: list[int]  # one placeholder token per image
    images: list[ImagePart]
    sampling: SamplingParams
    timeout_s: float


@dataclass(frozen=True)
class TokenEvent:
    token_ids: list[int]
    finish_reason: str | None = None  # set on the last event
    prompt_tokens: int = 0  # set on the first event


class Orchestrator:
    def __init__(self, registry: WorkerRegistry, image_token_id: int, attempts: int = 3, max_migrations: int = 2,
                 encoder_policy: str = "affinity", prefill_policy: str = "least_outstanding",
                 decode_policy: str = "least_outstanding") -> None:
        self.registry = registry
        self.image_token_id = image_token_id
        self.attempts = attempts
        self.max_migrations = max_migrations  # decode worker deaths one stream survives
        self.policies = {"encoder": make_policy(encoder_policy), "prefill": make_policy(prefill_policy),
                         "decode": make_policy(decode_policy)}
        self._releasing: set[asyncio.Task] = set()

    async def run(self, job: Job) -> AsyncIterator[TokenEvent]:
        span = tracing.request_span("epd.request", request_id=job.request_id, images=len(job.images))
        try:
            async for event in self._run(job, span):
                yield event
        except GeneratorExit:  # the consumer stopped early (client gone, stop string): not a failure
            span.end()
            raise
        except BaseException as exc:
            span.end(exc)
            raise
        span.end()

    async def _run(self, job: Job, span: tracing.Span) -> AsyncIterator[TokenEvent]:
        deadline = time.monotonic() + job.timeout_s
        try:
            prefilled = await self._encode_and_prefill(job, span, deadline)
        except UpstreamError as exc:
            if exc.code != grpc.StatusCode.ABORTED:
                raise
            # A transfer failed (its owner, now marked failed, died; or its lease expired): the
            # embeddings are gone, so encode again, on another encoder where the owner was one.
            prefilled = await self._encode_and_prefill(job, span, deadline)
        async for event in self._start_decode(job, span, deadline, prefilled):
            yield event

    async def _encode_and_prefill(self, job: Job, span: tracing.Span, deadline: float):
        ids, starts, embeddings = list(job.prompt_ids), [], []
        if job.images:
            embeddings = await _traced(span.child("encode"), lambda md: self._encode(job, deadline, md))
            try:
                ids, starts = expand_placeholders(job.prompt_ids, self.image_token_id,
                                                  [e.num_image_tokens for e in embeddings])
            except ValueError as exc:
                raise UpstreamError(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        request = prefill_pb2.PrefillRequest(request_id=job.request_id, token_ids=ids, embeddings=embeddings,
                                             mm_positions=starts, sampling=sampling_to_pb(job.sampling))
        try:
            prefilled = await _traced(span.child("prefill", prompt_tokens=len(ids)), lambda md: self._with_retries(
                "prefill", None, len(ids), deadline, lambda w, t: self._prefill(w, request, t, md)))
        except BaseException:  # failed, timed out or the client left: nobody will pull the embeddings
            self._release_later([e.handle for e in embeddings if e.HasField("handle")])
            raise
        return prefilled

    async def _start_decode(self, job: Job, span: tracing.Span, deadline: float, prefilled
                            ) -> AsyncIterator[TokenEvent]:
        """Stream the decode of `prefilled`; if the decode worker dies mid-stream, migrate: prefill
        the prompt plus the tokens sent so far again and go on from there on a live pair, so the
        client sees one uninterrupted stream (greedy: the very tokens an undisturbed run gives)."""
        generated: list[int] = []  # every token sent to the client so far
        for migration in range(self.max_migrations + 1):
            first = TokenEvent([prefilled.first_token_id], FINISH.get(prefilled.finish_reason),
                               prompt_tokens=0 if generated else prefilled.prompt_tokens)
            if first.finish_reason is not None:
                yield first
                return
            try:
                opened = await self._admit_decode(job, span, deadline, prefilled)
            except UpstreamError as exc:
                if exc.code != grpc.StatusCode.ABORTED or migration == self.max_migrations:
                    raise
                # The KV's owner (a prefill worker, now marked failed) died or its lease expired
                # before decode could pull it: prefill the same request again.
                log.warning("%s; prefilling request %s again", exc.message, job.request_id)
                prefilled = await self._encode_and_prefill(job, span, deadline)
                continue
            generated.append(prefilled.first_token_id)
            yield first
            try:
                async for event in self._decode(*opened):
                    generated.extend(event.token_ids)
                    yield event
                return
            except UpstreamError as exc:
                resumed = self._resumed_job(job, generated, migration + 1)
                if exc.code not in MIGRATABLE or migration == self.max_migrations or resumed is None:
                    raise
                log.warning("%s; migrating request %s after %d tokens", exc.message, job.request_id, len(generated))
            prefilled = await self._encode_and_prefill(resumed, span, deadline)
            job = resumed

    def _resumed_job(self, job: Job, generated: list[int], migration: int) -> Job | None:
        """The request as it stands after `generated`: a prompt to prefill again, the rest of the budget."""
        left = job.sampling.max_tokens - len(generated)
        if left < 1 or self.image_token_id in generated:  # nothing to continue, or a prompt we could not re-expand
            return None
        original = job.request_id.split("~", 1)[0]
        return Job(f"{original}~m{migration}", job.prompt_ids + generated, job.images,
                   dataclasses.replace(job.sampling, max_tokens=left), job.timeout_s)

    async def _admit_decode(self, job: Job, span: tracing.Span, deadline: float, prefilled):
        """A decode worker that admitted the request (worker, call, chunks read ahead)."""
        # The first token goes out only once a decode worker has admitted the request: a refusal
        # (full KV pool) can still go to another worker, or reach the client as a plain 429.
        decode = span.child("decode")
        try:
            opened = await self._with_retries("decode", None, 0, deadline,
                                              lambda w, t: self._open_decode(w, job, prefilled, t, decode.metadata))
        except BaseException as exc:  # refused everywhere, timed out or the client left before admission
            decode.end(exc if isinstance(exc, Exception) else None)
            self._release_later([prefilled.kv.handle])  # nobody will pull it: free it now, not at its TTL
            raise
        decode.end()
        return opened

    async def _encode(self, job: Job, deadline: float, metadata=()) -> list[common_pb2.EmbeddingRef]:
        request = encoder_pb2.EncodeRequest(request_id=job.request_id, images=[
            encoder_pb2.ImageInput(image_digest=im.pixel_digest, data=im.data) for im in job.images])

        async def call(worker: Worker, timeout: float):
            request.deadline_ms = deadline_ms_in(timeout)
            reply = await encoder_pb2_grpc.EncoderStub(worker.channel).Encode(request, timeout=timeout,
                                                                              metadata=metadata)
            return list(reply.embeddings)

        embeddings = await self._with_retries("encoder", job.images[0].pixel_digest, 0, deadline, call)
        if len(embeddings) != len(job.images):
            raise UpstreamError(grpc.StatusCode.INTERNAL, f"encoder answered {len(embeddings)} embeddings "
                                f"for {len(job.images)} images")
        return embeddings

    @staticmethod
    async def _prefill(worker: Worker, request: prefill_pb2.PrefillRequest, timeout: float, metadata=()):
        request.deadline_ms = deadline_ms_in(timeout)
        return await prefill_pb2_grpc.PrefillStub(worker.channel).Prefill(request, timeout=timeout, metadata=metadata)

    async def _open_decode(self, worker: Worker, job: Job, prefilled, timeout: float, metadata=()):
        """Start the Decode stream and wait for its admission chunk; (worker, call, chunks read ahead)."""
        request = decode_pb2.DecodeRequest(request_id=job.request_id, kv=prefilled.kv,
                                           first_token_id=prefilled.first_token_id,
                                           sampling=sampling_to_pb(job.sampling), deadline_ms=deadline_ms_in(timeout))
        call = decode_pb2_grpc.DecodeStub(worker.channel).Decode(request, timeout=timeout, metadata=metadata)
        try:
            chunk = await call.read()
        except BaseException:
            call.cancel()
            raise
        if chunk is grpc.aio.EOF:
            raise UpstreamError(grpc.StatusCode.INTERNAL, f"decode worker {worker.address} ended the stream "
                                                          "before admitting the request")
        ahead = [] if not chunk.token_ids and not chunk.finish_reason else [chunk]  # a worker with no admission chunk
        return worker, call, ahead

    def _release_later(self, handles: list[common_pb2.TransferHandle]) -> None:
        """Release `handles` in tasks of their own: they run even when this request was cancelled."""
        for handle in handles:
            task = asyncio.get_running_loop().create_task(self._release(handle))
            self._releasing.add(task)  # a strong reference until done (the loop keeps only weak ones)
            task.add_done_callback(self._releasing.discard)

    async def _release(self, handle: common_pb2.TransferHandle) -> None:
        """Best effort: ask the owner to drop a lease now (its TTL frees it if this fails)."""
        owner = next((w for w in self.registry.workers if w.address == handle.owner_address), None)
        if owner is None:
            return
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.TimeoutError):
            await transfer_pb2_grpc.TransferStub(owner.channel).Release(
                transfer_pb2.ReleaseRequest(handle_id=handle.handle_id), timeout=2.0)

    async def _decode(self, worker: Worker, call, ahead: list) -> AsyncIterator[TokenEvent]:
        worker.outstanding += 1
        try:
            for chunk in ahead:
                yield TokenEvent(list(chunk.token_ids), FINISH.get(chunk.finish_reason))
            while (chunk := await call.read()) is not grpc.aio.EOF:  # read(), as for the admission chunk
                yield TokenEvent(list(chunk.token_ids), FINISH.get(chunk.finish_reason))
        except grpc.aio.AioRpcError as exc:
            self._blame(worker, exc)
            raise UpstreamError(exc.code(), f"decode worker {worker.address}: {exc.details()}") from None
        finally:
            worker.outstanding -= 1
            call.cancel()  # no-op when the stream ended; otherwise the worker sees the cancellation

    async def _with_retries(self, role: str, key: str | None, tokens: int, deadline: float,
                            call: Callable[[Worker, float], Awaitable]):
        last: UpstreamError | None = None
        tried: set[str] = set()
        for _ in range(self.attempts):
            worker = self._pick(role, key, exclude=tried)
            tried.add(worker.address)
            worker.outstanding += 1
            worker.outstanding_tokens += tokens
            try:
                return await call(worker, _left(deadline))
            except grpc.aio.AioRpcError as exc:
                last = UpstreamError(exc.code(), f"{role} worker {worker.address}: {exc.details()}")
                self._blame(worker, exc)
                if exc.code() not in RETRYABLE:
                    raise last from None
            finally:
                worker.outstanding -= 1
                worker.outstanding_tokens -= tokens
        raise last

    def _blame(self, worker: Worker, exc: grpc.aio.AioRpcError) -> None:
        """Mark failed whoever failed: the worker when unreachable, or the peer it names (the owner of
        a transfer it could not pull), never a healthy worker that only reported someone else's death."""
        peer = failed_peer_of(exc)
        if peer:
            owner = next((w for w in self.registry.workers if w.address == peer), None)
            if owner is not None:
                self.registry.mark_failed(owner, f"unreachable from {worker.address}: {exc.details()}")
        elif exc.code() == grpc.StatusCode.UNAVAILABLE:
            self.registry.mark_failed(worker, exc.details() or "unavailable")

    def _pick(self, role: str, key: str | None, exclude: set[str] = frozenset()) -> Worker:
        candidates = [w for w in self.registry.ready(role) if w.address not in exclude] or self.registry.ready(role)
        try:
            return self.policies[role].pick(candidates, key)
        except NoWorkerAvailable:
            raise UpstreamError(grpc.StatusCode.UNAVAILABLE, f"no ready {role} worker") from None


def failed_peer_of(exc: grpc.aio.AioRpcError) -> str:
    """The address a worker's error trailers blame (epd.rpc_errors.FAILED_PEER_KEY), or ""."""
    for key, value in exc.trailing_metadata() or ():
        if key == FAILED_PEER_KEY:
            return value if isinstance(value, str) else value.decode()
    return ""


async def _traced(span: tracing.Span, call: Callable[[tuple], Awaitable]):
    """Await `call(metadata)` inside `span` (its metadata carries the trace to the worker)."""
    try:
        result = await call(span.metadata)
    except BaseException as exc:
        span.end(exc)
        raise
    span.end()
    return result


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise UpstreamError(grpc.StatusCode.DEADLINE_EXCEEDED, "the request's deadline passed")
    return left


async def aclose_quietly(stream: AsyncIterator) -> None:
    """Close an async generator, swallowing what its cleanup raises (the client is gone anyway)."""
    with contextlib.suppress(Exception):
        await stream.aclose()
