"""Start-up checks of a checkpoint's files, before anything else is loaded (no torch, no transformers).

Importing those takes seconds; a worker pointed at a missing or incomplete checkpoint says so at once
instead, which also keeps a supervisor's restart loop on a checkpoint that went away fast.

Checkpoints keep the image processor config either in `preprocessor_config.json` (the classic
layout) or in the `image_processor` entry of `processor_config.json` (transformers 5's layout).
"""

from __future__ import annotations

import json
from pathlib import Path

from epd.models.errors import MissingImageProcessorError, ModelLoadError

PREPROCESSOR_FILE = "preprocessor_config.json"
PROCESSOR_FILE = "processor_config.json"


def require_checkpoint_dir(model_dir: str | Path) -> Path:
    """`model_dir` as a Path if it holds a model config; raises naming the directory otherwise."""
    root = Path(model_dir)
    if not (root / "config.json").is_file():
        raise ModelLoadError(f"{root}: not a checkpoint directory (config.json is missing)")
    return root


def require_image_processor_config(model_dir: str | Path) -> Path:
    """The file that holds the image processor config; raises naming the directory and the file."""
    root = require_checkpoint_dir(model_dir)
    classic = root / PREPROCESSOR_FILE
    if classic.is_file():
        return classic
    combined = root / PROCESSOR_FILE
    if combined.is_file() and "image_processor" in _read_json(combined):
        return combined
    raise MissingImageProcessorError(
        f"{root}: no image processor config — {PREPROCESSOR_FILE} is missing "
        f"(and {PROCESSOR_FILE} has no 'image_processor' entry); an encoder cannot start without it"
    )


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path}: unreadable processor config ({exc})") from exc
