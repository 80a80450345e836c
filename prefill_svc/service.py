"""The prefill worker's domain logic: gather the prompt's embeddings (local cache, else pull from the
encoder), run the prompt through the engine (batched with other prompts, chunked when long), and
lease the finished prompt's KV blocks to the decode worker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from epd import metrics
from epd.engine.encode import EncodedImage
from epd.engine.loop import EngineLoop
from epd.engine.params import SamplingParams
from epd.engine.sequence import Finish
from epd.lru import ByteBudgetLRU
from epd.rpc_errors import Cancelled, InvalidInput, Overloaded
from epd.transfer.receiver import TransferReceiver
from epd.transfer.sender import TransferSender
from prefill_svc.config import PrefillConfig

ROLE = "prefill"
_POLL_S = 0.25  # how often a waiting prefill checks that its caller is still there


@dataclass(frozen=True)
class ImageEmbedding:
    """What the request says about one image: where its tensors are and where its tokens start."""

    digest: str
    num_tokens: int
    grid_thw: tuple[int, int, int]
    metas: Sequence  # common_pb2.TensorMeta, in tensor order
    handle: object | None  # common_pb2.TransferHandle; None when inline tensors were sent
    inline: dict | None  # name -> tensor, when sent inline
    start: int  # index of the first image token in token_ids


@dataclass(frozen=True)
class PrefillResult:
    first_token: int
    finish_reason: str | None  # "stop" / "length" when the request already ended, else None
    prompt_tokens: int
    kv_handle: object | None = None  # common_pb2.TransferHandle
    kv_tensors: list | None = None  # [(name, tensor)], for their metadata
    position_delta: int = 0
    block_size: int = 0


class PrefillService:
    def __init__(self, loop: EngineLoop, receiver: TransferReceiver, sender: TransferSender,
                 config: PrefillConfig) -> None:
        self.loop = loop
        self.engine = loop.engine
        self.receiver = receiver
        self.sender = sender
        self.config = config
        self.image_token_id = int(self.engine.language.config.image_token_id)
        self.cache: ByteBudgetLRU[str, EncodedImage] = ByteBudgetLRU(config.embedding_cache_bytes)
        limits = self.engine.config.scheduler
        # Each prefill holds a gRPC thread until its prompt is done: cap them (see worker_args).
        self.max_in_flight = limits.max_running + limits.max_waiting
        self._in_flight = threading.BoundedSemaphore(self.max_in_flight)

    def warm_up(self) -> None:
        """A real prompt through the engine, its KV exported as a decode worker would receive it."""
        seq = self.engine.new_sequence("warm-up", [0, 1, 2], SamplingParams(max_tokens=2, ignore_eos=True),
                                       handoff=True)
        out = self.loop.submit(seq).get(timeout_s=self.config.prefill_timeout_s)
        if out.finish is not Finish.HANDOFF or not out.kv:
            raise RuntimeError(f"warm-up prefill ended with {out.finish} and no KV")

    def prefill(self, request_id: str, token_ids: list[int], images: list[ImageEmbedding], params: SamplingParams,
                stop_token_ids: Sequence[int], timeout_s: float,
                is_active: Callable[[], bool] = lambda: True) -> PrefillResult:
        """`is_active`: False once the caller is gone (then the prompt is aborted, its blocks freed)."""
        if not request_id:
            raise InvalidInput("request_id is empty; the engine keys requests by it")
        self._validate(token_ids, images)
        if not self._in_flight.acquire(blocking=False):
            raise Overloaded(f"{self.max_in_flight} prefills already in flight; try again later")
        try:
            return self._prefill(request_id, token_ids, images, params, stop_token_ids, timeout_s, is_active)
        finally:
            self._in_flight.release()

    def _prefill(self, request_id: str, token_ids: list[int], images: list[ImageEmbedding], params: SamplingParams,
                 stop_token_ids: Sequence[int], timeout_s: float, is_active: Callable[[], bool]) -> PrefillResult:
        encoded = [self._embedding(im, timeout_s) for im in images]
        seq = self.engine.new_sequence(request_id, token_ids, params, encoded, [im.start for im in images],
                                       digests=[im.digest for im in images], extra_stop_ids=stop_token_ids,
                                       handoff=True)
        stream = self.loop.submit(seq)
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not is_active():  # past the deadline or the caller left: free the blocks now
                self.loop.abort(request_id)
                raise TimeoutError(f"prefill of {len(token_ids)} tokens not done in {timeout_s:.1f} s") \
                    if left <= 0 else Cancelled("the caller went away during the prefill")
            try:
                out = stream.get(min(left, _POLL_S))
                break
            except TimeoutError:
                continue
        if out.finish is not Finish.HANDOFF:
            return PrefillResult(out.token, out.finish.value, len(token_ids))
        handle = self.sender.publish(out.kv, kind="kv", ttl_s=self.config.kv_lease_ttl_s)
        return PrefillResult(out.token, None, len(token_ids), handle, out.kv, seq.inputs.plan.delta,
                             self.engine.config.block_size)

    def _embedding(self, image: ImageEmbedding, timeout_s: float) -> EncodedImage:
        if image.inline is not None:
            return EncodedImage(tensors=image.inline, grid_thw=image.grid_thw)
        cached = self.cache.get(image.digest)
        (metrics.EMBEDDING_CACHE_HITS if cached else metrics.EMBEDDING_CACHE_MISSES).labels(ROLE).inc()
        if cached is not None:
            self.receiver.release(image.handle)  # the ack: we will never pull it
            return cached
        tensors = self.receiver.fetch(image.handle, image.metas, kind="embedding",
                                      timeout_s=min(timeout_s, self.config.pull_timeout_s))
        encoded = EncodedImage(tensors=dict(tensors), grid_thw=image.grid_thw)
        if encoded.num_tokens != image.num_tokens:
            raise InvalidInput(f"image {image.digest[:12]}: {encoded.num_tokens} embedding rows for "
                               f"{image.num_tokens} image tokens")
        self.cache.put(image.digest, encoded, encoded.nbytes)
        metrics.EMBEDDING_CACHE_BYTES.labels(ROLE).set(self.cache.bytes_used)
        return encoded

    def _validate(self, token_ids: list[int], images: list[ImageEmbedding]) -> None:
        if not token_ids:
            raise InvalidInput("token_ids is empty")
        if len(token_ids) > self.config.max_prompt_tokens:
            raise InvalidInput(f"prompt has {len(token_ids)} tokens; the limit is {self.config.max_prompt_tokens}")
        if len(token_ids) >= self.engine.max_model_len:
            raise InvalidInput(f"prompt has {len(token_ids)} tokens; the model's context is "
                               f"{self.engine.max_model_len}")
        bad = next((t for t in token_ids if not 0 <= t < self.engine.vocab_size), None)
        if bad is not None:
            raise InvalidInput(f"token id {bad} is outside the vocabulary [0, {self.engine.vocab_size})")
        cursor = 0
        for k, im in enumerate(images):
            span = token_ids[im.start:im.start + im.num_tokens]
            if im.start < cursor or len(span) != im.num_tokens or any(t != self.image_token_id for t in span):
                raise InvalidInput(f"image {k}: tokens [{im.start}, {im.start + im.num_tokens}) are not "
                                   f"{im.num_tokens} image tokens after the previous image")
            cursor = im.start + im.num_tokens
        placed = sum(im.num_tokens for im in images)
        if token_ids.count(self.image_token_id) != placed:
            raise InvalidInput(f"prompt has {token_ids.count(self.image_token_id)} image tokens but the images "
                               f"account for {placed}")
