"""Parameter count and memory of the encoder role, the language role and the full model.

Each load runs in its own fresh process so peak RSS is that load's alone:
    .venv/bin/python scripts/measure_roles.py DIR
"""

from __future__ import annotations

import json
import subprocess
import sys

LOADERS = {
    "encoder": "from epd.models.loading import load_encoder as f; m = f(d).model",
    "language": "from epd.models.loading import load_language_model as f; m = f(d).model",
    "full": "from transformers import AutoModelForImageTextToText as A; m = A.from_pretrained(d)",
}


def measure_in_child(model_dir: str, role: str) -> dict:
    code = (
        "import json, sys; import torch, transformers; d = sys.argv[1]\n"
        "def status():\n"
        "    rows = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
        "    return {k: int(rows[k].split()[0]) / 1024 for k in ('VmHWM', 'RssAnon', 'RssFile')}\n"
        "before = status()\n"
        f"{LOADERS[role]}\n"
        # Touch every weight: memory-mapped tensors count only once their pages are read.
        "[float(p.sum()) for p in m.parameters()]\n"
        "after = status()\n"
        "print(json.dumps({'parameters': sum(p.numel() for p in m.parameters()),"
        " 'peak_rss_mb': after['VmHWM'], 'anon_added_mb': after['RssAnon'] - before['RssAnon'],"
        " 'file_added_mb': after['RssFile'] - before['RssFile']}))"
    )
    out = subprocess.run([sys.executable, "-c", code, model_dir], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    model_dir = sys.argv[1]
    # peak RSS: the process's high-water mark. anon: memory the load allocated (materialised
    # weights). file: checkpoint pages mapped in (safetensors are memory-mapped, so reading a
    # tensor shows up here).
    print(f"{'role':<10}{'parameters':>14}{'peak RSS MB':>13}{'anon +MB':>10}{'file +MB':>10}")
    for role in LOADERS:
        r = measure_in_child(model_dir, role)
        print(f"{role:<10}{r['parameters']:>14,}{r['peak_rss_mb']:>13.0f}{r['anon_added_mb']:>10.0f}"
              f"{r['file_added_mb']:>10.0f}")


if __name__ == "__main__":
    main()
