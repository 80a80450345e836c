"""The prefill worker's domain logic: gather the prompt's embeddings (local cache, else pull from the
encoder), run the prompt through the language model, sample the first token, lease the KV cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epd import metrics
from epd.engine.encode import EncodedImage
from epd.engine.kv import export_kv
from epd.engine.language import LanguageRunner
from epd.engine.sampling import Sampler, SamplingParams
from epd.lru import ByteBudgetLRU
from epd.model_gate import ModelGate
from epd.rpc_errors import InvalidInput
from epd.transfer.receiver import TransferReceiver
from epd.transfer.sender import TransferSender
from prefill_svc.config import PrefillConfig

ROLE = "prefill"


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


class PrefillService:
    def __init__(self, runner: LanguageRunner, receiver: TransferReceiver, sender: TransferSender,
                 eos_token_ids: Sequence[int], config: PrefillConfig) -> None:
        self.runner = runner
        self.receiver = receiver
        self.sender = sender
        self.eos_token_ids = tuple(eos_token_ids)
        self.config = config
        self.vocab_size = int(runner.language.config.get_text_config().vocab_size)
        self.cache: ByteBudgetLRU[str, EncodedImage] = ByteBudgetLRU(config.embedding_cache_bytes)
        self.gate = ModelGate(ROLE, config.max_queue)

    def warm_up(self) -> None:
        """A real forward over a short text prompt."""
        logits, _ = self.runner.prefill([0, 1, 2], [], [])
        if logits.shape[-1] != self.vocab_size:
            raise RuntimeError(f"warm-up forward gave {logits.shape[-1]} logits, expected {self.vocab_size}")

    def prefill(self, token_ids: list[int], images: list[ImageEmbedding], params: SamplingParams,
                stop_token_ids: Sequence[int], timeout_s: float) -> PrefillResult:
        self._validate(token_ids, images)
        encoded = [self._embedding(im, timeout_s) for im in images]
        metrics.RUNNING.labels(ROLE).inc()
        try:
            with self.gate.turn(timeout_s):
                logits, state = self.runner.prefill(token_ids, encoded, [im.start for im in images])
        finally:
            metrics.RUNNING.labels(ROLE).dec()
        first = Sampler(params)(logits)
        stops = set(stop_token_ids) | (set() if params.ignore_eos else set(self.eos_token_ids))
        finish = "stop" if first in stops else "length" if params.max_tokens <= 1 else None
        if finish is not None:
            return PrefillResult(first, finish, len(token_ids))
        kv = export_kv(state.cache)
        handle = self.sender.publish(kv, kind="kv", ttl_s=self.config.kv_lease_ttl_s)
        return PrefillResult(first, None, len(token_ids), handle, kv, state.plan.delta)

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
        bad = next((t for t in token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidInput(f"token id {bad} is outside the vocabulary [0, {self.vocab_size})")
        image_token = self.runner.image_token_id
        cursor = 0
        for k, im in enumerate(images):
            span = token_ids[im.start:im.start + im.num_tokens]
            if im.start < cursor or len(span) != im.num_tokens or any(t != image_token for t in span):
                raise InvalidInput(f"image {k}: tokens [{im.start}, {im.start + im.num_tokens}) are not "
                                   f"{im.num_tokens} image tokens after the previous image")
            cursor = im.start + im.num_tokens
        placed = sum(im.num_tokens for im in images)
        if token_ids.count(image_token) != placed:
            raise InvalidInput(f"prompt has {token_ids.count(image_token)} image tokens but the images "
                               f"account for {placed}")
