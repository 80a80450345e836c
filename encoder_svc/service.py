"""The encoder's domain logic: decode images, look them up in the embedding store, batch the misses
through the vision tower, and lease the results to prefill workers.

Images are re-decoded and re-hashed here even though the router already did: the store is keyed by
what this encoder computed from the pixels and its own processor, never by a caller's claim.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

from PIL import Image

from encoder_svc.config import EncoderConfig, max_batch_images_for
from epd import metrics
from epd.batcher import MicroBatcher
from epd.digest import FileDigests, embedding_key, processor_fingerprint
from epd.engine.encode import EncodedImage, ImageEncoder
from epd.lru import ByteBudgetLRU
from epd.rpc_errors import Cancelled, InvalidInput
from epd.threads import set_thread_compute
from epd.transfer.sender import TransferSender

ROLE = "encoder"


@dataclass(frozen=True)
class ImageRequest:
    """One image as the router sent it: encoded file bytes and (optionally) its pixel digest."""

    data: bytes
    pixel_digest: str = ""


@dataclass(frozen=True)
class LeasedEmbedding:
    """One image's answer: the cache key, its encoder output and the handle a prefill worker pulls."""

    key: str
    image: EncodedImage
    handle: object  # common_pb2.TransferHandle


class EncoderService:
    def __init__(self, encoder: ImageEncoder, sender: TransferSender, config: EncoderConfig,
                 compute_threads: int | None = None) -> None:
        self.encoder = encoder
        self.sender = sender
        self.config = config
        self.fingerprint = processor_fingerprint(encoder.encoder.model_dir)
        self.store: ByteBudgetLRU[str, EncodedImage] = ByteBudgetLRU(config.cache_bytes)
        self.seen_files = FileDigests()  # a file decoded before needs no decode to find its cached embeddings
        self.batcher: MicroBatcher[Image.Image, EncodedImage] = MicroBatcher(
            self._encode_batch, max_batch=max_batch_images_for(config.max_batch_images, encoder.device.type),
            max_wait_s=config.batch_wait_ms / 1000,
            max_queue=config.max_queue_images, on_batch=metrics.ENCODER_BATCH_SIZE.observe,
            on_queue_depth=metrics.QUEUE_DEPTH.labels(ROLE).set,
            # The batcher thread runs the tower: the process's one OpenMP team (see epd.threads).
            thread_init=None if compute_threads is None else lambda: set_thread_compute(compute_threads))
        self.batcher.start()

    def warm_up(self) -> None:
        """A real encode through processor and tower, so readiness means the whole path works."""
        image = Image.new("RGB", (64, 64), (127, 64, 200))
        [out] = self.encoder.encode([image])
        if out.num_tokens < 1:
            raise RuntimeError("warm-up encode produced no image tokens")

    def encode(self, images: list[ImageRequest], timeout_s: float,
               is_active: Callable[[], bool] = lambda: True) -> list[LeasedEmbedding]:
        """Embeddings of `images` (cached or computed), each under a lease. `is_active`: False once the
        caller is gone; its images still waiting for a batch are then dropped, and nothing is leased."""
        pixels = [self._pixels(i, im) for i, im in enumerate(images)]  # (digest, image or None) each
        keys = [embedding_key(digest, self.fingerprint) for digest, _ in pixels]
        results: dict[str, EncodedImage] = {}
        missing: dict[str, Image.Image] = {}
        pinned: set[str] = set()  # keys this request holds a pin on (taken atomically with the lookup / store)
        try:
            for index, (key, (_, image)) in enumerate(zip(keys, pixels, strict=True)):
                if key in results or key in missing:
                    continue
                hit = self.store.get_and_pin(key)
                (metrics.EMBEDDING_CACHE_HITS if hit else metrics.EMBEDDING_CACHE_MISSES).labels(ROLE).inc()
                if hit is not None:
                    results[key] = hit
                    pinned.add(key)
                else:  # a file seen before whose embeddings have since been evicted: decode it after all
                    missing[key] = image if image is not None else self._decode(index, images[index])
            if missing:
                computed = self.batcher.submit_many(list(missing.values()), timeout_s, is_active)
                for key, out in zip(missing, computed, strict=True):
                    if self.store.put(key, out, out.nbytes, pin=True):
                        pinned.add(key)
                    results[key] = out
            metrics.EMBEDDING_CACHE_BYTES.labels(ROLE).set(self.store.bytes_used)
            if not is_active():  # computed and cached for the next request, but nobody would pull a lease
                raise Cancelled("the caller went away during the encode")
            leased = []
            for key in keys:
                # The first lease of a key takes over the pin held; a repeat pins again (safe: still held).
                own_pin = key in pinned
                pinned.discard(key)
                if not own_pin:  # a repeat: the earlier lease's pin keeps it there, if it had one
                    own_pin = self.store.pin(key)
                leased.append(self._lease(key, results[key], own_pin))
            return leased
        finally:
            for key in pinned:  # failed before every pin had its lease
                self.store.unpin(key)

    def close(self) -> None:
        self.batcher.close()

    def _pixels(self, index: int, image: ImageRequest) -> tuple[str, Image.Image | None]:
        """(pixel digest, decoded RGB image); the image is None when these very bytes were decoded before."""
        if len(image.data) > self.config.max_image_bytes:
            raise InvalidInput(f"image {index} is {len(image.data)} bytes; the limit is {self.config.max_image_bytes}")
        digest, rgb = self.seen_files.pixel_digest(image.data, lambda _: self._decode(index, image))
        if image.pixel_digest and image.pixel_digest != digest:
            raise InvalidInput(f"image {index}: the digest sent does not match the image's pixels")
        return digest, rgb

    def _decode(self, index: int, image: ImageRequest) -> Image.Image:
        """The file's pixels, its size already checked by `_pixels`."""
        try:
            with Image.open(io.BytesIO(image.data)) as opened:
                if opened.width * opened.height > self.config.max_image_pixels:
                    raise InvalidInput(f"image {index} is {opened.width}x{opened.height} pixels; "
                                       f"the limit is {self.config.max_image_pixels}")
                opened.load()
                rgb = opened.convert("RGB")
        except InvalidInput:
            raise
        except Exception as exc:  # Pillow raises many types for bad files; all mean the same to a caller
            raise InvalidInput(f"image {index} is not a readable image ({exc})") from None
        return rgb

    def _encode_batch(self, images: list[Image.Image]) -> list[EncodedImage | Exception]:
        """One forward for the batch; if it fails, each image alone, so a bad one fails only its request."""
        metrics.RUNNING.labels(ROLE).inc()
        try:
            try:
                return self.encoder.encode(images)
            except Exception:
                if len(images) == 1:
                    return [self._encode_alone(images[0])]
            return [self._encode_alone(image) for image in images]
        finally:
            metrics.RUNNING.labels(ROLE).dec()

    def _encode_alone(self, image: Image.Image) -> EncodedImage | Exception:
        try:
            [out] = self.encoder.encode([image])
            return out
        except ValueError as exc:  # the processor refusing this image's shape (e.g. 1xN pixels): the input's fault
            return InvalidInput(f"a {image.width}x{image.height} image cannot be processed by this model: {exc}")
        except Exception as exc:  # anything else is ours: INTERNAL, retryable on another encoder
            return exc

    def _lease(self, key: str, image: EncodedImage, pinned: bool) -> LeasedEmbedding:
        # While a handle is out, the entry stays pinned: what prefill may still pull counts against the budget.
        try:
            handle = self.sender.publish(list(image.tensors.items()), kind="embedding",
                                         ttl_s=self.config.lease_ttl_s,
                                         on_release=(lambda: self.store.unpin(key)) if pinned else None)
        except BaseException:
            if pinned:
                self.store.unpin(key)
            raise
        return LeasedEmbedding(key, image, handle)


