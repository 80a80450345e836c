"""Opening images from files for the CLI, with errors a user can act on."""

from __future__ import annotations

from pathlib import Path

from PIL import Image, UnidentifiedImageError


def open_image_file(path: str | Path) -> Image.Image:
    """Decode an image file fully (so a truncated file fails here, not inside the encoder)."""
    try:
        with Image.open(path) as image:
            image.load()
            return image.convert("RGB")
    except FileNotFoundError:
        raise ValueError(f"image file not found: {path}") from None
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"cannot read image {path}: {exc}") from None
