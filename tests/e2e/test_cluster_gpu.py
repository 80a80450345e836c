"""`epd serve --device cuda` equals transformers for both families, embeddings and KV moving by cuda_ipc
(every worker on one GPU: NCCL would refuse two ranks on one device). float32 so greedy tokens can be
compared with the CPU reference. Skipped without CUDA; scripts/gpu_check.sh runs it on a GPU machine."""

from __future__ import annotations

import pytest
import torch

from tests.e2e.cluster import start_cluster
from tests.e2e.conftest import assert_one_image_answer_is_the_reference

MAX_TOKENS = 12

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("family", ["kimi_k25", "qwen3_vl_moe"])
def test_cuda_cluster_equals_transformers(e2e_dirs, family):
    cluster = start_cluster(e2e_dirs[family], "--device", "cuda", "--dtype", "float32", "--transfer", "cuda_ipc")
    try:
        assert_one_image_answer_is_the_reference(cluster.base_url, family, e2e_dirs[family], MAX_TOKENS)
    finally:
        assert cluster.stop() == 0
