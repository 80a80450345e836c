"""Files other processes poll: written whole or not at all."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: str | Path, text: str) -> None:
    """`text` into `path` through a temporary file and a rename: a reader never sees half of it."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
