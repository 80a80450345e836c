#!/usr/bin/env bash
# Create .venv/ at the repository root and install the project with its dev tools.
# Idempotent: re-running only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required"'

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip

# torch and torchvision must come as a matching pair (the Kimi-K2.5 image processor needs
# torchvision). Pin the pair explicitly so pip never resolves a mismatched or newer build.
if ! .venv/bin/python -c 'import torch, torchvision' >/dev/null 2>&1; then
  case "$(uname -m)" in
    aarch64|arm64) TORCH_PAIR=${EPD_TORCH_PAIR:-"torch==2.9.1 torchvision==0.24.1"} ;;
    *)             TORCH_PAIR=${EPD_TORCH_PAIR:-"torch==2.14.1 torchvision==0.29.1"} ;;
  esac
  # shellcheck disable=SC2086
  .venv/bin/python -m pip install --quiet $TORCH_PAIR
fi
.venv/bin/python -m pip install --quiet -e '.[dev]'
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
