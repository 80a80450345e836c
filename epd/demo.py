"""The demo checkpoint: generated once by `make-tiny-model`, cached, reused by `epd generate` and `epd serve`."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

DEMO_FAMILY = "kimi_k25"
DEMO_SIZE = "tiny"
DEMO_SEED = 0


def cache_root() -> Path:
    """`$EPD_CACHE_DIR`, else `$XDG_CACHE_HOME/epd`, else `~/.cache/epd`."""
    if env := os.environ.get("EPD_CACHE_DIR"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "epd"


def demo_model_dir(family: str = DEMO_FAMILY, size: str = DEMO_SIZE, seed: int = DEMO_SEED) -> Path:
    """Path of the cached demo checkpoint, generating it on first use (atomically: no half-written dir)."""
    target = cache_root() / "models" / f"{family}-{size}-seed{seed}"
    if _is_complete(target, family, size, seed):
        return target
    from epd.tiny.writer import make_tiny_model

    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        make_tiny_model(family, size, staging, seed=seed)
        if target.exists():  # an incomplete leftover from an interrupted run
            shutil.rmtree(target)
        staging.rename(target)
    except FileExistsError:
        pass  # another process finished first; its copy is as good as ours
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _is_complete(path: Path, family: str, size: str, seed: int) -> bool:
    marker = path / "epd_tiny_model.json"
    try:
        info = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    from epd.tiny.writer import FORMAT_VERSION

    wanted = (family, size, seed, FORMAT_VERSION)
    return (info.get("family"), info.get("size"), info.get("seed"), info.get("format")) == wanted
