"""One streamed request through an in-memory transport: counts, timings present, failures as results."""

import asyncio
import json

import httpx

from epd.bench.client import chat_body, send_request
from epd.bench.workloads import WorkloadSpec, make_request

URL = "http://bench.test/v1/chat/completions"


def sse(*payloads, done: bool = True) -> bytes:
    events = [f"data: {json.dumps(p)}\n\n" for p in payloads] + (["data: [DONE]\n\n"] if done else [])
    return "".join(events).encode()


def role() -> dict:
    return {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}


def token(text: str = "x") -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


def usage(completion_tokens: int) -> dict:
    return {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": completion_tokens}}


def send(handler, timeout_s: float = 5.0):
    async def go():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await send_request(client, URL, b"{}", index=4, timeout_s=timeout_s)

    return asyncio.run(go())


def test_a_stream_is_timed_and_counted_from_usage():
    # Three content chunks but usage says 4: one chunk carried two tokens; usage is the truth.
    body = sse(role(), token("a"), token("b"), token("c"), {"choices": [{"delta": {}, "finish_reason": "length"}]},
               usage(4))
    result = send(lambda request: httpx.Response(200, content=body))
    assert result.ok, result.error
    assert (result.index, result.status, result.output_tokens, result.prompt_tokens) == (4, 200, 4, 11)
    assert len(result.itl_s) == 2  # gaps between the three token-carrying chunks
    assert 0 <= result.ttft_s <= result.e2e_s
    assert result.tpot_s is not None
    assert (result.output_text, result.output_ids) == ("abc", None)  # no ids sent: the text only


def test_the_output_ids_are_collected_where_the_server_sends_them():
    chunks = [{"choices": [{"index": 0, "delta": {"content": t}, "token_ids": ids}]} for t, ids in
              (("a", [7]), ("", [8]), ("bc", [9, 10]))]  # "": a token held back by the detokenizer
    result = send(lambda request: httpx.Response(200, content=sse(role(), *chunks, usage(4))))
    assert result.ok and (result.output_text, result.output_ids) == ("abc", (7, 8, 9, 10))


def test_without_usage_the_chunks_are_counted():
    result = send(lambda request: httpx.Response(200, content=sse(role(), token(), token())))
    assert result.ok and result.output_tokens == 2


def test_http_errors_keep_status_and_openai_message():
    body = {"error": {"message": "queue full", "type": "rate_limit_error"}}
    result = send(lambda request: httpx.Response(429, json=body))
    assert not result.ok
    assert (result.status, result.error) == (429, "HTTP 429: queue full")


def test_an_error_chunk_mid_stream_fails_the_request():
    body = sse(role(), token(), {"error": {"message": "decode worker died", "type": "server_error"}})
    result = send(lambda request: httpx.Response(200, content=body))
    assert not result.ok and result.error == "decode worker died"
    assert result.output_tokens == 1


def test_a_stream_cut_before_done_is_a_failure():
    result = send(lambda request: httpx.Response(200, content=sse(role(), token(), done=False)))
    assert not result.ok and "[DONE]" in result.error


def test_no_tokens_is_a_failure():
    result = send(lambda request: httpx.Response(200, content=sse(role(), usage(0))))
    assert not result.ok and "no tokens" in result.error


def test_connection_errors_and_timeouts_are_results_not_exceptions():
    def refuse(request):
        raise httpx.ConnectError("connection refused")

    result = send(refuse)
    assert not result.ok and result.status is None and "ConnectError" in result.error

    async def slow(request):
        await asyncio.sleep(2)
        return httpx.Response(200, content=sse(role(), token()))

    result = send(slow, timeout_s=0.05)
    assert not result.ok and result.error == "timed out after 0.05 s"


def test_chat_body_asks_for_exactly_n_greedy_tokens_with_usage():
    body = json.loads(chat_body(make_request(WorkloadSpec("image-1"), 0), "m", 48))
    assert body["model"] == "m"
    assert (body["max_tokens"], body["temperature"], body["ignore_eos"], body["stream"]) == (48, 0, True, True)
    assert body["stream_options"] == {"include_usage": True}
    assert body["return_token_ids"] is True  # outputs compared with hf's by id where the server obliges
    assert body["messages"][0]["content"][0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert "model" not in json.loads(chat_body(make_request(WorkloadSpec("text"), 0), None, 8))
