"""`epd serve --transfer nccl` on a CPU machine (gloo carries the bytes): greedy output equals transformers,
both families, with embeddings (encoder -> prefill) and KV (prefill -> decode) both sent over pair groups."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.cluster import start_cluster
from tests.e2e.conftest import data_url, openai_messages, pattern_image, reference

MAX_TOKENS = 12


@pytest.mark.parametrize("family", ["kimi_k25", "qwen3_vl_moe"])
def test_nccl_transfer_equals_transformers(e2e_dirs, family):
    expected_ids, expected_text = reference(e2e_dirs[family], (1,), MAX_TOKENS)
    cluster = start_cluster(e2e_dirs[family], "--transfer", "nccl")
    try:
        client = openai.OpenAI(base_url=cluster.base_url, api_key="unused", max_retries=0, timeout=120)
        reply = client.chat.completions.create(
            model=family, messages=openai_messages([data_url(pattern_image(1))]), max_tokens=MAX_TOKENS,
            temperature=0, extra_body={"return_token_ids": True})
        assert (reply.choices[0].model_extra or {}).get("token_ids") == expected_ids
        assert reply.choices[0].message.content == expected_text
        # Logged by a puller once its group with an owner is up: both hops (prefill, decode) made one.
        pullers = [line for line in cluster.output if "using gloo (puller)" in line]
        assert len(pullers) >= 2, "".join(cluster.output)
    finally:
        assert cluster.stop() == 0
