"""Image digests: the keys of the embedding caches.

The router hashes decoded pixels (`pixel_digest`) for encoder affinity; the encoder mixes in the
fingerprint of the image processor it owns (`embedding_key`), so two checkpoints with different
processors never share an entry, and the router never needs the processor config.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from PIL import Image

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
