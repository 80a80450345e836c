"""Whose fault is it: real encoder and prefill processes, called over gRPC as the router calls them.

A pull whose owner is dead is ABORTED (retry the request) and names the owner in the trailers, so
the router blames the owner, not the prefill that reported it; an expired lease is never NOT_FOUND
(the client would see 404); one unprocessable image fails only its own request in a micro-batch.
"""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from PIL import Image

from epd.rpc_errors import FAILED_PEER_KEY
from epd.v1 import common_pb2, encoder_pb2, encoder_pb2_grpc, prefill_pb2, prefill_pb2_grpc
from tests.e2e.cluster import free_port, wait_for_ready_file
from tests.e2e.conftest import pattern_image, png_bytes


@pytest.fixture
def workers(e2e_dirs, processes):
    model = e2e_dirs["kimi_k25"]
    files = {"encoder": processes.start("encoder", "encoder", "--model", model, "--batch-wait-ms", "400"),
             "prefill": processes.start("prefill", "prefill", "--model", model)}
    return {name: wait_for_ready_file(path, list(processes.procs.values()))["address"] for name, path in files.items()}


def encode(address: str, data: bytes) -> encoder_pb2.EncodeResponse:
    with grpc.insecure_channel(address) as channel:
        return encoder_pb2_grpc.EncoderStub(channel).Encode(encoder_pb2.EncodeRequest(
            request_id="r", images=[encoder_pb2.ImageInput(data=data)]), timeout=60)


def prefill_with(address: str, ref: common_pb2.EmbeddingRef, image_token: int) -> grpc.RpcError:
    request = prefill_pb2.PrefillRequest(request_id="p", token_ids=[5] + [image_token] * ref.num_image_tokens + [6],
                                         embeddings=[ref], mm_positions=[1])
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as info:
        prefill_pb2_grpc.PrefillStub(channel).Prefill(request, timeout=60)
    return info.value


def image_token_id(model_dir: str) -> int:
    import json
    from pathlib import Path

    return json.loads((Path(model_dir) / "config.json").read_text())["image_token_id"]


def test_a_pull_from_a_dead_owner_blames_the_owner_and_is_retryable(workers, e2e_dirs):
    [ref] = encode(workers["encoder"], png_bytes(pattern_image(1))).embeddings
    dead = f"127.0.0.1:{free_port()}"
    ref.handle.owner_address = dead  # as if the encoder that owns it had died
    error = prefill_with(workers["prefill"], ref, image_token_id(e2e_dirs["kimi_k25"]))
    assert error.code() == grpc.StatusCode.ABORTED, error.details()
    assert dict(error.trailing_metadata())[FAILED_PEER_KEY] == dead


def test_an_expired_lease_is_retryable_not_not_found(workers, e2e_dirs):
    [ref] = encode(workers["encoder"], png_bytes(pattern_image(2))).embeddings
    ref.handle.handle_id = "0" * 32  # the live owner no longer knows it (what an expired lease looks like)
    error = prefill_with(workers["prefill"], ref, image_token_id(e2e_dirs["kimi_k25"]))
    assert error.code() == grpc.StatusCode.ABORTED, error.details()
    assert FAILED_PEER_KEY not in dict(error.trailing_metadata())  # the owner is alive: blame nobody


def test_one_bad_image_fails_only_its_own_request_in_a_batch(e2e_dirs, processes):
    """Qwen3-VL's processor refuses aspect ratios over 200: a 1x201 image passes the router, then fails here."""
    ready = processes.start("encoder", "encoder", "--model", e2e_dirs["qwen3_vl_moe"], "--batch-wait-ms", "400")
    address = wait_for_ready_file(ready, list(processes.procs.values()))["address"]
    thin = io.BytesIO()
    Image.new("RGB", (1, 201), (9, 9, 9)).save(thin, format="PNG")
    images = [thin.getvalue()] + [png_bytes(pattern_image(i)) for i in range(3, 6)]

    def outcome(data: bytes):
        try:
            return len(encode(address, data).embeddings)
        except grpc.RpcError as exc:
            return exc.code(), exc.details()

    with ThreadPoolExecutor(4) as pool:  # inside one 400 ms batching window: one micro-batch
        results = list(pool.map(outcome, images))
    assert results[1:] == [1, 1, 1], results
    code, details = results[0]
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "1x201" in details, results[0]
