"""SSE framing and what each OpenAI chat-completion chunk counts for."""

import json

from epd.bench.sse import Chunk, SseParser, parse_chunk


def feed_all(lines: list[str]) -> list[str]:
    parser = SseParser()
    events = [e for line in lines if (e := parser.feed(line)) is not None]
    tail = parser.flush()
    return events + ([tail] if tail is not None else [])


def data(payload: dict) -> str:
    return json.dumps(payload)


def test_events_end_at_blank_lines_and_data_lines_join():
    lines = ["data: {\"a\": 1}", "", ": keep-alive", "", "data: x", "data: y", "", "event: ping", "id: 3", "",
             "data: [DONE]", ""]
    assert feed_all(lines) == ['{"a": 1}', "x\ny", "[DONE]"]


def test_crlf_and_missing_space_and_unterminated_last_event():
    assert feed_all(["data:one\r\n", "\r\n", "data: two"]) == ["one", "two"]


def test_role_chunk_carries_no_token_and_content_chunks_one_each():
    assert parse_chunk(data({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})).tokens == 0
    assert parse_chunk(data({"choices": [{"index": 0, "delta": {"content": "Hello"}}]})).tokens == 1


def test_token_ids_give_an_exact_count():
    on_choice = {"choices": [{"index": 0, "delta": {"content": "ab"}, "token_ids": [5, 6, 7]}]}  # vLLM, ours
    in_delta = {"choices": [{"index": 0, "delta": {"content": "ab", "token_ids": [5, 6]}}]}  # older servers
    assert (parse_chunk(data(on_choice)).tokens, parse_chunk(data(in_delta)).tokens) == (3, 2)


def test_a_chunk_carries_its_text_and_ids():
    chunk = parse_chunk(data({"choices": [{"index": 0, "delta": {"content": "ab"}, "token_ids": [5, 6]}]}))
    assert (chunk.text, chunk.token_ids) == ("ab", (5, 6))
    bare = parse_chunk(data({"choices": [{"index": 0, "delta": {"content": None}, "token_ids": "x"}]}))
    assert (bare.text, bare.token_ids) == ("", ())  # odd shapes carry nothing, and do not raise
    assert parse_chunk(data({"choices": []})).text == ""
    assert parse_chunk(data({"choices": {"0": {}}})) == Chunk()  # not a list: nothing, not an exception


def test_an_empty_content_without_role_is_a_held_back_token():
    # Our gateway sends this when the detokenizer holds a split UTF-8 character back.
    assert parse_chunk(data({"choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": None}]})).tokens == 1


def test_finish_and_usage_chunks_carry_no_token():
    assert parse_chunk(data({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})).tokens == 0
    # vLLM may close with an empty content and a finish reason in the same chunk.
    assert parse_chunk(data({"choices": [{"delta": {"content": ""}, "finish_reason": "length"}]})).tokens == 0
    usage = parse_chunk(data({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 48}}))
    assert usage == Chunk(tokens=0, completion_tokens=48, prompt_tokens=9)


def test_reasoning_content_counts_as_a_token():
    assert parse_chunk(data({"choices": [{"delta": {"reasoning_content": "hmm"}}]})).tokens == 1


def test_done_error_and_malformed():
    assert parse_chunk("[DONE]").done
    assert parse_chunk(data({"error": {"message": "decode worker died", "type": "server_error"}})).error == (
        "decode worker died")
    assert "malformed" in parse_chunk("{not json").error
    assert "unexpected" in parse_chunk("[1, 2]").error
