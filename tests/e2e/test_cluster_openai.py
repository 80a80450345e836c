"""The official openai client against `epd serve`, both families: greedy output equals transformers'.

Kimi-K2.5 runs with the grpc transfer backend, Qwen3-VL-MoE with shm, so both backends carry real
embeddings and KV caches here.
"""

from __future__ import annotations

import concurrent.futures

import grpc
import openai
import pytest

from epd.v1 import common_pb2, router_pb2, router_pb2_grpc
from tests.e2e.cluster import start_cluster
from tests.e2e.conftest import QUESTION, data_url, openai_messages, pattern_image, png_bytes, reference

TRANSFER = {"kimi_k25": "grpc", "qwen3_vl_moe": "shm"}
MAX_TOKENS = 20


@pytest.fixture(scope="module", params=sorted(TRANSFER))
def served(request, e2e_dirs, image_server):
    family = request.param
    host_port = image_server.removeprefix("http://")
    cluster = start_cluster(e2e_dirs[family], "--transfer", TRANSFER[family], "--allow-url-host", host_port)
    client = openai.OpenAI(base_url=cluster.base_url, api_key="unused", max_retries=0, timeout=120)
    yield family, e2e_dirs[family], cluster, client
    assert cluster.stop() == 0


def _extra(obj, name):
    return (obj.model_extra or {}).get(name)


def test_non_streaming_data_urls_equal_transformers(served):
    family, model_dir, _, client = served
    expected_ids, expected_text = reference(model_dir, (1, 2), MAX_TOKENS)
    reply = client.chat.completions.create(
        model=family, messages=openai_messages([data_url(pattern_image(1)), data_url(pattern_image(2))]),
        max_tokens=MAX_TOKENS, temperature=0, extra_body={"return_token_ids": True})
    choice = reply.choices[0]
    assert len(set(expected_ids)) >= 6  # a reference that could not tell paths apart would prove nothing
    assert _extra(choice, "token_ids") == expected_ids
    assert choice.message.content == expected_text
    assert choice.finish_reason == ("length" if len(expected_ids) == MAX_TOKENS else "stop")
    assert reply.usage.completion_tokens == len(expected_ids)


def test_streaming_http_url_equals_transformers(served, image_server):
    family, model_dir, _, client = served
    expected_ids, expected_text = reference(model_dir, (3,), MAX_TOKENS)
    stream = client.chat.completions.create(
        model=family, messages=openai_messages([f"{image_server}/img/3.png"]), max_tokens=MAX_TOKENS,
        temperature=0, stream=True, stream_options={"include_usage": True}, extra_body={"return_token_ids": True})
    text, ids, finish, usage, prompt_ids = [], [], None, None, []
    for chunk in stream:
        prompt_ids.append(_extra(chunk, "prompt_token_ids"))
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            ids.extend(_extra(choice, "token_ids") or [])
            finish = choice.finish_reason or finish
    assert ids == expected_ids  # vLLM's shape: token_ids on each stream choice
    assert "".join(text) == expected_text
    assert len(prompt_ids[0]) > 10 and prompt_ids[1:] == [None] * (len(prompt_ids) - 1)  # on the first chunk only
    assert finish == ("length" if len(expected_ids) == MAX_TOKENS else "stop")
    assert usage is not None and usage.completion_tokens == len(expected_ids) and usage.prompt_tokens > 10


def test_text_only_with_system_turn(served):
    family, model_dir, _, client = served
    expected_ids, expected_text = reference(model_dir, (), MAX_TOKENS, "Say something.", "Be brief.")
    reply = client.chat.completions.create(
        model=family, messages=openai_messages([], "Say something.", "Be brief."), max_tokens=MAX_TOKENS,
        temperature=0, extra_body={"return_token_ids": True})
    assert _extra(reply.choices[0], "token_ids") == expected_ids
    assert reply.choices[0].message.content == expected_text


def test_sixteen_concurrent_streams_with_different_images(served):
    family, model_dir, _, client = served
    indices = list(range(10, 26))
    expected = {i: reference(model_dir, (i,), 12)[0] for i in indices}
    assert len({tuple(v) for v in expected.values()}) >= 8  # different images really give different answers

    def run(index: int) -> list[int]:
        stream = client.chat.completions.create(
            model=family, messages=openai_messages([data_url(pattern_image(index))]), max_tokens=12,
            temperature=0, stream=True, extra_body={"return_token_ids": True})
        return [t for chunk in stream for c in chunk.choices for t in (_extra(c, "token_ids") or [])]

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        got = dict(zip(indices, pool.map(run, indices), strict=True))
    assert got == expected


def test_grpc_router_generate_equals_transformers(served):
    _, model_dir, cluster, _ = served
    expected_ids, expected_text = reference(model_dir, (4,), MAX_TOKENS)
    request = router_pb2.GenerateRequest(
        request_id="grpc-1", return_token_ids=True,
        sampling=common_pb2.SamplingParams(max_tokens=MAX_TOKENS),  # temperature 0: greedy
        messages=[router_pb2.ChatMessage(role=router_pb2.ROLE_USER, content=[
            router_pb2.ContentPart(image_bytes=png_bytes(pattern_image(4))), router_pb2.ContentPart(text=QUESTION)])])
    with grpc.insecure_channel(cluster.grpc_address) as channel:
        events = list(router_pb2_grpc.RouterStub(channel).Generate(request, timeout=120))
    chunks = [e.chunk for e in events if e.WhichOneof("event") == "chunk"]
    [complete] = [e.complete for e in events if e.WhichOneof("event") == "complete"]
    assert [t for c in chunks for t in c.token_ids] == expected_ids
    assert "".join(c.text for c in chunks) == expected_text
    assert complete.usage.completion_tokens == len(expected_ids)
