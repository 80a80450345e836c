"""deploy/CONFIGURATION.md is what scripts/gen_config_reference.py makes from today's parsers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_configuration_reference_is_current():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_config_reference.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_the_reference_names_the_environment_variables_flags_really_read():
    text = (ROOT / "deploy" / "CONFIGURATION.md").read_text()
    assert "| `--kv-cache-mb` | `1024` | `EPD_KV_CACHE_MB` |" in text
    assert "| `--embedding-cache-mb` | `256` | `EPD_PREFILL_CACHE_MB` |" in text
    for command in ("epd serve", "epd encoder", "epd prefill", "epd decode", "epd colocated", "epd router",
                    "epd bench compare"):
        assert f"## `{command}`" in text
