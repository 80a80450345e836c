#!/usr/bin/env bash
# The whole test suite: generated-code check, lint, unit and model tests.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/python scripts/gen_protos.py --check
.venv/bin/ruff check .
.venv/bin/python -m pytest -p no:cacheprovider "$@"
