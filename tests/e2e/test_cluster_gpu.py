"""`epd serve --device cuda` equals transformers for both families, embeddings and KV moving by cuda_ipc
(every worker on one GPU: NCCL would refuse two ranks on one device). float32 so greedy tokens can be
compared with the CPU reference. Skipped without CUDA; scripts/gpu_check.sh runs it on a GPU machine."""

from __future__ import annotations

import openai
import pytest
import torch

from tests.e2e.cluster import start_cluster
from tests.e2e.conftest import data_url, openai_messages, pattern_image, reference

MAX_TOKENS = 12

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("family", ["kimi_k25", "qwen3_vl_moe"])
def test_cuda_cluster_equals_transformers(e2e_dirs, family):
    expected_ids, expected_text = reference(e2e_dirs[family], (1,), MAX_TOKENS)
    cluster = start_cluster(e2e_dirs[family], "--device", "cuda", "--dtype", "float32", "--transfer", "cuda_ipc")
    try:
        client = openai.OpenAI(base_url=cluster.base_url, api_key="unused", max_retries=0, timeout=120)
        reply = client.chat.completions.create(
            model=family, messages=openai_messages([data_url(pattern_image(1))]), max_tokens=MAX_TOKENS,
            temperature=0, extra_body={"return_token_ids": True})
        assert (reply.choices[0].model_extra or {}).get("token_ids") == expected_ids
        assert reply.choices[0].message.content == expected_text
    finally:
        assert cluster.stop() == 0
