"""`epd serve --transfer nccl` on a CPU machine (gloo carries the bytes): greedy output equals transformers,
both families, with embeddings (encoder -> prefill) and KV (prefill -> decode) both sent over pair groups."""

from __future__ import annotations

import pytest

from tests.e2e.cluster import start_cluster
from tests.e2e.conftest import assert_one_image_answer_is_the_reference

MAX_TOKENS = 12


@pytest.mark.parametrize("family", ["kimi_k25", "qwen3_vl_moe"])
def test_nccl_transfer_equals_transformers(e2e_dirs, family):
    cluster = start_cluster(e2e_dirs[family], "--transfer", "nccl")
    try:
        assert_one_image_answer_is_the_reference(cluster.base_url, family, e2e_dirs[family], MAX_TOKENS)
        # Logged by a puller once its group with an owner is up: both hops (prefill, decode) made one.
        pullers = [line for line in cluster.output if "using gloo (puller)" in line]
        assert len(pullers) >= 2, "".join(cluster.output)
    finally:
        assert cluster.stop() == 0
