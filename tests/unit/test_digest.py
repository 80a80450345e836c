"""pixel_digest, processor_fingerprint and embedding_key: the embedding-cache keys."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest
from PIL import Image

from epd.digest import FileDigests, embedding_key, pixel_digest, processor_fingerprint
from epd.models.errors import MissingImageProcessorError, ModelLoadError

PROCESSOR = {"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "patch_size": 16,
             "size": {"longest_edge": 1024, "shortest_edge": 64}, "do_resize": True}


def picture(width: int = 5, height: int = 4, mode: str = "RGB") -> Image.Image:
    image = Image.new(mode, (width, height))
    image.putdata([((x * 37 + y * 11) % 256, (x * 5) % 256, (y * 91) % 256)
                   for y in range(height) for x in range(width)])
    return image


def reopened(image: Image.Image, fmt: str) -> Image.Image:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    buffer.seek(0)
    return Image.open(buffer)


# --- pixel_digest --------------------------------------------------------------------------------------------


def test_pixel_digest_is_sha256_over_mode_size_and_pixels():
    image = Image.frombytes("L", (2, 1), b"\x01\x02")
    assert pixel_digest(image) == hashlib.sha256(b"L:2x1:\x01\x02").hexdigest()


def test_pixel_digest_is_64_hex_chars_and_deterministic():
    digest = pixel_digest(picture())
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert pixel_digest(picture()) == digest


def test_same_pixels_as_png_and_bmp_have_the_same_digest():
    image = picture()
    png, bmp = reopened(image, "PNG"), reopened(image, "BMP")
    assert (png.format, bmp.format) == ("PNG", "BMP")
    assert pixel_digest(png) == pixel_digest(bmp) == pixel_digest(image)


def test_one_changed_pixel_changes_the_digest():
    image, changed = picture(), picture()
    r, g, b = changed.getpixel((3, 2))
    changed.putpixel((3, 2), (r, g, (b + 1) % 256))
    assert pixel_digest(changed) != pixel_digest(image)


def test_same_bytes_in_a_different_size_differ():
    data = bytes(range(6))
    assert pixel_digest(Image.frombytes("L", (2, 3), data)) != pixel_digest(Image.frombytes("L", (3, 2), data))


def test_same_bytes_in_a_different_mode_differ():
    data = bytes(range(6))
    assert pixel_digest(Image.frombytes("L", (3, 2), data)) != pixel_digest(Image.frombytes("P", (3, 2), data))


def test_converted_mode_differs():
    image = picture()
    assert pixel_digest(image.convert("RGBA")) != pixel_digest(image)


# --- processor_fingerprint ----------------------------------------------------------------------------------


def checkpoint(root: Path, processor: dict | None = PROCESSOR, *, layout: str = "classic", indent=None,
               sort_keys: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"model_type": "test"}))
    if processor is None:
        return root
    if layout == "classic":
        (root / "preprocessor_config.json").write_text(json.dumps(processor, indent=indent, sort_keys=sort_keys))
    else:
        combined = {"processor_class": "TestProcessor", "image_processor": processor}
        (root / "processor_config.json").write_text(json.dumps(combined, indent=indent, sort_keys=sort_keys))
    return root


def canonical_sha(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def test_fingerprint_is_the_sha256_of_the_canonical_json(tmp_path):
    assert processor_fingerprint(checkpoint(tmp_path)) == canonical_sha(PROCESSOR)


def test_fingerprint_accepts_a_str_path(tmp_path):
    assert processor_fingerprint(str(checkpoint(tmp_path))) == canonical_sha(PROCESSOR)


def test_fingerprint_ignores_key_order_and_whitespace(tmp_path):
    reordered = dict(reversed(list(PROCESSOR.items())))
    a = processor_fingerprint(checkpoint(tmp_path / "a", PROCESSOR))
    b = processor_fingerprint(checkpoint(tmp_path / "b", reordered, indent=4))
    c = processor_fingerprint(checkpoint(tmp_path / "c", PROCESSOR, sort_keys=True, indent="\t"))
    assert a == b == c


def test_fingerprint_changes_with_a_value(tmp_path):
    changed = {**PROCESSOR, "patch_size": 14}
    assert processor_fingerprint(checkpoint(tmp_path / "a")) != processor_fingerprint(checkpoint(tmp_path / "b",
                                                                                                changed))


def test_fingerprint_changes_with_a_nested_value(tmp_path):
    changed = {**PROCESSOR, "size": {"longest_edge": 1024, "shortest_edge": 32}}
    assert processor_fingerprint(checkpoint(tmp_path / "a")) != processor_fingerprint(checkpoint(tmp_path / "b",
                                                                                                changed))


def test_fingerprint_of_the_processor_config_layout_is_its_image_processor_entry(tmp_path):
    combined = processor_fingerprint(checkpoint(tmp_path / "new", layout="combined", indent=2))
    assert combined == canonical_sha(PROCESSOR)
    assert combined == processor_fingerprint(checkpoint(tmp_path / "old"))  # same processor, same key


def test_classic_file_wins_when_both_exist(tmp_path):
    root = checkpoint(tmp_path, {**PROCESSOR, "patch_size": 14}, layout="combined")
    (root / "preprocessor_config.json").write_text(json.dumps(PROCESSOR))
    assert processor_fingerprint(root) == canonical_sha(PROCESSOR)


def test_missing_processor_config_raises(tmp_path):
    with pytest.raises(MissingImageProcessorError, match="no image processor config"):
        processor_fingerprint(checkpoint(tmp_path, None))


def test_processor_config_without_image_processor_entry_raises(tmp_path):
    root = checkpoint(tmp_path, None)
    (root / "processor_config.json").write_text(json.dumps({"processor_class": "TextOnly"}))
    with pytest.raises(MissingImageProcessorError):
        processor_fingerprint(root)


def test_not_a_checkpoint_raises_model_load_error(tmp_path):
    with pytest.raises(ModelLoadError, match="config.json is missing") as info:
        processor_fingerprint(tmp_path)
    assert not isinstance(info.value, MissingImageProcessorError)


# --- embedding_key --------------------------------------------------------------------------------------------


def test_embedding_key_is_sha256_of_fingerprint_and_digest():
    assert embedding_key("ab" * 32, "cd" * 32) == hashlib.sha256(f"{'cd' * 32}:{'ab' * 32}".encode()).hexdigest()


def test_embedding_key_differs_by_fingerprint(tmp_path):
    digest = pixel_digest(picture())
    fp_a = processor_fingerprint(checkpoint(tmp_path / "a"))
    fp_b = processor_fingerprint(checkpoint(tmp_path / "b", {**PROCESSOR, "image_mean": [0.4, 0.4, 0.4]}))
    assert embedding_key(digest, fp_a) != embedding_key(digest, fp_b)
    assert embedding_key(digest, fp_a) == embedding_key(digest, fp_a)


def test_embedding_key_differs_by_image():
    fp = "0" * 64
    assert embedding_key(pixel_digest(picture(5, 4)), fp) != embedding_key(pixel_digest(picture(4, 5)), fp)


def test_embedding_key_is_not_the_pixel_digest():
    digest = pixel_digest(picture())
    assert embedding_key(digest, "0" * 64) != digest


def test_file_digests_remember_by_the_exact_bytes():
    seen = FileDigests()
    assert seen.get(b"file one") is None
    seen.put(b"file one", "d1")
    assert seen.get(b"file one") == "d1"
    assert seen.get(b"file one ") is None  # one byte more is another file


def test_file_digests_forget_the_least_recently_used_beyond_their_bound():
    seen = FileDigests(max_entries=2)
    seen.put(b"a", "da")
    seen.put(b"b", "db")
    assert seen.get(b"a") == "da"  # now b is the least recently used
    seen.put(b"c", "dc")
    assert (seen.get(b"a"), seen.get(b"b"), seen.get(b"c")) == ("da", None, "dc")
