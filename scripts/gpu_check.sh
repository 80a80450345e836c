#!/usr/bin/env bash
# GPU checks, under 8 minutes on a machine with one or more CUDA GPUs; prints the figures.
#
#   bash scripts/gpu_check.sh            # uses $PYTHON, else .venv/bin/python, else python3
#
# 1. the GPU tests: cuda_ipc between processes, nccl between two GPUs (skipped with one), a cluster on
#    cuda equal to transformers for both families, and the CPU-side device/dtype tests;
# 2. the transfer bench (grpc, shm, nccl, cuda_ipc) at 64 MB, each beside its medium's limit;
# 3. decode tokens/s at batch 1, 8 and 32 on the GPU beside the HBM bound (epd bench decode).
# Each step has its own timeout; the script goes on after a failure and exits non-zero at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
failed=0
step() {  # step NAME TIMEOUT_S COMMAND...
  local name=$1 limit=$2; shift 2
  echo "=== $name"
  local started=$SECONDS
  timeout "$limit" "$@" || { echo "!!! $name failed (exit $?)"; failed=1; }
  echo "--- $name: $((SECONDS - started)) s"
}

nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv || true
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, \
'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())" || exit 1

step "GPU tests" 240 "$PY" -m pytest -q -rs -p no:cacheprovider tests/unit/transfer/test_gpu_transfers.py \
  tests/unit/test_devices.py tests/e2e/test_cluster_gpu.py

step "transfer bench (64 MB)" 120 "$PY" -m epd bench transfer --backend grpc,shm,nccl,cuda_ipc --size-mb 64 --json

model=$(mktemp -d)
trap 'rm -rf "$model"' EXIT
"$PY" -m epd make-tiny-model --family qwen3_vl_moe --size small --out "$model" >/dev/null || exit 1
for batch in 1 8 32; do
  step "decode, batch $batch" 60 "$PY" -m epd bench decode --model "$model" --device cuda --batch "$batch" \
    --context 256 --steps 20 --json
done
exit $failed
