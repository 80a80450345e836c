"""Image digests: the keys of the embedding caches.

The router hashes decoded pixels (`pixel_digest`) for encoder affinity; the encoder mixes in the
fingerprint of the image processor it owns (`embedding_key`), so two checkpoints with different
processors never share an entry, and the router never needs the processor config.

Both decode every file they are sent before they can hash its pixels: 3.6 ms for a 448x448 PNG,
on the critical path of a request whose embeddings are already cached, and paid twice (router and
encoder). `FileDigests` remembers what a file's decode led to, by the SHA-256 of its bytes
(0.04 ms for that PNG): the same bytes always decode to the same pixels.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from PIL import Image

from epd.lru import ByteBudgetLRU
from epd.models.processor_files import PROCESSOR_FILE, require_image_processor_config


def pixel_digest(image: Image.Image) -> str:
    """SHA-256 (hex) over mode, size and the decoded pixel bytes: equal for equal pixels, whatever the file format."""
    h = hashlib.sha256()
    h.update(f"{image.mode}:{image.size[0]}x{image.size[1]}:".encode())
    h.update(image.tobytes())
    return h.hexdigest()


def processor_fingerprint(model_dir: str | Path) -> str:
    """SHA-256 (hex) of the image processor config, canonicalised so formatting changes do not matter."""
    path = require_image_processor_config(model_dir)
    config = json.loads(path.read_text())
    if path.name == PROCESSOR_FILE:
        config = config["image_processor"]
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def embedding_key(pixel_digest_hex: str, fingerprint: str) -> str:
    """The cache key of one image's embeddings under one processor."""
    return hashlib.sha256(f"{fingerprint}:{pixel_digest_hex}".encode()).hexdigest()


class FileDigests:
    """A bounded, thread-safe map from an encoded file's bytes (by SHA-256) to a digest its decode gave.

    Only put what a decode of these very bytes produced, after every check on them passed under
    limits that do not change for the process's life: a hit then stands for that decode.
    `pixel_digest` is that rule in one place, for the router and the encoder alike.
    """

    def __init__(self, max_entries: int = 4096) -> None:
        # Each entry is two short strings, so a count bounds its memory (4096: well under 1 MiB).
        self._digests: ByteBudgetLRU[str, str] = ByteBudgetLRU(capacity_bytes=max_entries, max_entries=max_entries)

    def get(self, data: bytes) -> str | None:
        return self._digests.get(_file_key(data))

    def put(self, data: bytes, digest: str) -> None:
        self._digests.put(_file_key(data), digest, nbytes=1)

    def pixel_digest(self, data: bytes, decode: Callable[[bytes], Image.Image]) -> tuple[str, Image.Image | None]:
        """(the file's pixel digest, its pixels if they were decoded now, else None).

        `decode` checks and decodes the file; whatever it raises passes through and nothing is
        remembered. The file is hashed once, whether it is found or stored.
        """
        key = _file_key(data)
        digest = self._digests.get(key)
        if digest is not None:
            return digest, None
        image = decode(data)
        digest = pixel_digest(image)
        self._digests.put(key, digest, nbytes=1)
        return digest, image


def _file_key(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
