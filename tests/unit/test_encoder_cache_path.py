"""EncoderService's cache path with a stand-in tower: a file sent again skips Pillow's decode, and
every check a decode made still holds for it (digest mismatch, evicted embeddings, bad files)."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from encoder_svc.config import EncoderConfig, max_batch_images_for
from encoder_svc.service import EncoderService, ImageRequest
from epd.digest import pixel_digest
from epd.engine.encode import EncodedImage
from epd.rpc_errors import Cancelled, InvalidInput


class _Tower:
    """Stands in for ImageEncoder: one 4-token embedding per image, whose rows carry the image's width."""

    def __init__(self, model_dir: str) -> None:
        self.encoder = SimpleNamespace(model_dir=model_dir)
        self.device = torch.device("cpu")
        self.images_encoded = 0

    def encode(self, images: list[Image.Image]) -> list[EncodedImage]:
        self.images_encoded += len(images)
        return [EncodedImage({"pooler_output": torch.full((4, 2), float(im.width))}, (1, 4, 4)) for im in images]


class _Sender:
    def __init__(self) -> None:
        self.published = 0

    def publish(self, tensors, kind, ttl_s, on_release=None):
        self.published += 1
        return SimpleNamespace(kind=kind, on_release=on_release)


def png(width: int, shade: int = 90) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, 8), (shade, 20, 200)).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def service(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"patch_size": 14}))
    svc = EncoderService(_Tower(str(tmp_path)), _Sender(), EncoderConfig(model_dir=str(tmp_path), batch_wait_ms=0))
    decodes = []
    real_decode = svc._decode
    svc._decode = lambda index, image: decodes.append(index) or real_decode(index, image)
    svc.decodes = decodes
    yield svc
    svc.close()


def test_a_file_sent_again_is_served_from_the_cache_without_a_decode(service):
    data = png(16)
    [first] = service.encode([ImageRequest(data)], timeout_s=5)
    [again] = service.encode([ImageRequest(data)], timeout_s=5)
    assert service.decodes == [0]  # the first request only
    assert service.encoder.images_encoded == 1
    assert again.key == first.key
    assert torch.equal(again.image.tensors["pooler_output"], first.image.tensors["pooler_output"])


def test_the_same_pixels_in_other_bytes_decode_once_each_and_share_the_embedding(service):
    pixels = Image.new("RGB", (16, 8), (90, 20, 200))
    as_bmp = io.BytesIO()
    pixels.save(as_bmp, format="BMP")
    [a] = service.encode([ImageRequest(png(16))], timeout_s=5)
    [b] = service.encode([ImageRequest(as_bmp.getvalue())], timeout_s=5)
    assert service.decodes == [0, 0]
    assert a.key == b.key and service.encoder.images_encoded == 1


def test_a_wrong_digest_is_refused_even_for_a_file_seen_before(service):
    data = png(16)
    right = pixel_digest(Image.open(io.BytesIO(data)).convert("RGB"))
    service.encode([ImageRequest(data, right)], timeout_s=5)
    with pytest.raises(InvalidInput, match="digest sent does not match"):
        service.encode([ImageRequest(data, "0" * 64)], timeout_s=5)
    assert service.decodes == [0]


def test_a_file_whose_embeddings_were_evicted_is_decoded_and_encoded_again(service):
    data = png(16)
    [first] = service.encode([ImageRequest(data)], timeout_s=5)
    service.store.discard(first.key)
    [again] = service.encode([ImageRequest(data)], timeout_s=5)
    assert service.decodes == [0, 0]
    assert service.encoder.images_encoded == 2
    assert torch.equal(again.image.tensors["pooler_output"], first.image.tensors["pooler_output"])


def test_an_unreadable_file_fails_every_time_it_is_sent(service):
    for _ in range(2):
        with pytest.raises(InvalidInput, match="image 1 is not a readable image"):
            service.encode([ImageRequest(png(16)), ImageRequest(b"\x89PNG not really")], timeout_s=5)
    assert service.decodes == [0, 1, 1]  # the good file once, the bad one on every try


def test_images_per_forward_default_by_device_and_as_asked_otherwise():
    assert max_batch_images_for(0, "cpu") == 4  # batching saves no work on a CPU; smaller batches start prefill sooner
    assert max_batch_images_for(0, "cuda") == 8
    assert max_batch_images_for(3, "cpu") == 3 and max_batch_images_for(16, "cuda") == 16
    with pytest.raises(ValueError, match="max_batch_images"):
        max_batch_images_for(-1, "cpu")
    with pytest.raises(ValueError, match="0: by device"):
        EncoderConfig(model_dir="m", max_batch_images=-2)


def test_the_service_batches_at_most_the_devices_default(service):
    assert service.batcher._max_batch == 4  # the stand-in tower is on the CPU


def test_a_caller_gone_by_the_end_of_its_encode_gets_no_lease_but_the_cache_keeps_the_result(service):
    data = png(16)
    with pytest.raises(Cancelled):
        service.encode([ImageRequest(data)], timeout_s=5, is_active=lambda: False)
    assert service.sender.published == 0
    [again] = service.encode([ImageRequest(data)], timeout_s=5)  # a later caller: a cache hit
    assert service.encoder.images_encoded == 1 and service.sender.published == 1
    assert service.store.pin_count(again.key) == 1  # the new lease's; the cancelled call kept none


def test_a_caller_gone_while_its_image_waits_for_a_batch_is_never_encoded(tmp_path):
    import threading
    import time

    class _HeldTower(_Tower):
        def __init__(self, model_dir: str) -> None:
            super().__init__(model_dir)
            self.entered, self.gate = threading.Event(), threading.Event()

        def encode(self, images):
            self.entered.set()
            assert self.gate.wait(10)
            return super().encode(images)

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"patch_size": 14}))
    tower = _HeldTower(str(tmp_path))
    svc = EncoderService(tower, _Sender(), EncoderConfig(model_dir=str(tmp_path), batch_wait_ms=0))
    try:
        first = threading.Thread(target=svc.encode, args=([ImageRequest(png(16))], 10))
        first.start()
        assert tower.entered.wait(10)  # the tower is busy with the first image
        wanted = threading.Event()
        wanted.set()
        threading.Timer(0.3, wanted.clear).start()  # the second caller leaves while its image is queued
        started = time.monotonic()
        with pytest.raises(Cancelled):
            svc.encode([ImageRequest(png(24))], timeout_s=10, is_active=wanted.is_set)
        assert time.monotonic() - started < 5  # at the next look, not at the 10 s timeout
        assert svc.batcher.queue_depth == 0
        tower.gate.set()
        first.join(10)
        assert tower.images_encoded == 1 and svc.sender.published == 1  # the queued image never reached it
    finally:
        tower.gate.set()
        svc.close()
