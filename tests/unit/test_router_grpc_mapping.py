"""request_body: a GenerateRequest as the OpenAI body the HTTP gateway would get, accepted by the same parser."""

from __future__ import annotations

import base64

import pytest

from epd.engine.sampling import SamplingParams
from epd.v1 import common_pb2, router_pb2
from router.chat_request import RequestLimits, parse_chat_request
from router.errors import RequestError
from router.grpc_api import request_body

PNG_BYTES = b"\x89PNG\r\n\x1a\n\x00\x01\xfe\xff"
LIMITS = RequestLimits()


def text(value: str) -> router_pb2.ContentPart:
    return router_pb2.ContentPart(text=value)


def message(role: int, *parts: router_pb2.ContentPart) -> router_pb2.ChatMessage:
    return router_pb2.ChatMessage(role=role, content=list(parts))


def request(*messages: router_pb2.ChatMessage, **sampling) -> router_pb2.GenerateRequest:
    return router_pb2.GenerateRequest(messages=list(messages) or [message(router_pb2.ROLE_USER, text("hi"))],
                                      sampling=common_pb2.SamplingParams(**sampling))


def test_minimal_request_body_is_exact():
    assert request_body(request()) == {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "return_token_ids": False,
        "temperature": 0.0,
    }


def test_roles_are_mapped_in_order():
    body = request_body(request(message(router_pb2.ROLE_SYSTEM, text("s")), message(router_pb2.ROLE_USER, text("u")),
                                message(router_pb2.ROLE_ASSISTANT, text("a"))))
    assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant"]
    assert [m["content"] for m in body["messages"]] == [[{"type": "text", "text": t}] for t in "sua"]


def test_unknown_role_gets_a_name_the_parser_refuses():
    assert request_body(request(message(router_pb2.ROLE_UNSPECIFIED, text("x"))))["messages"][0]["role"] == "role#0"


def test_image_url_part():
    body = request_body(request(message(router_pb2.ROLE_USER, router_pb2.ContentPart(image_url="https://x/a.png"),
                                        text("what is this?"))))
    assert body["messages"][0]["content"] == [{"type": "image_url", "image_url": {"url": "https://x/a.png"}},
                                              {"type": "text", "text": "what is this?"}]


def test_image_bytes_become_a_base64_data_url():
    body = request_body(request(message(router_pb2.ROLE_USER, router_pb2.ContentPart(image_bytes=PNG_BYTES))))
    url = body["messages"][0]["content"][0]["image_url"]["url"]
    assert url == "data:image/unknown;base64," + base64.b64encode(PNG_BYTES).decode()
    assert base64.b64decode(url.split(",", 1)[1]) == PNG_BYTES


def test_empty_part_is_marked_and_refused_by_the_parser():
    body = request_body(request(message(router_pb2.ROLE_USER, router_pb2.ContentPart())))
    assert body["messages"][0]["content"] == [{"type": "empty"}]
    with pytest.raises(RequestError) as info:
        parse_chat_request(body, limits=LIMITS)
    assert (info.value.status, info.value.param) == (400, "messages[0].content[0].type")


def test_zero_sampling_fields_are_omitted_except_temperature():
    body = request_body(request())
    assert set(body) == {"messages", "return_token_ids", "temperature"}
    assert body["temperature"] == 0.0


def test_every_sampling_field_is_carried():
    body = request_body(request(temperature=0.5, top_p=0.25, top_k=7, seed=42, max_tokens=33, ignore_eos=True,
                                stop=["\n\n", "User:"]))
    assert {k: v for k, v in body.items() if k != "messages"} == {
        "return_token_ids": False, "temperature": 0.5, "top_p": 0.25, "top_k": 7, "seed": 42, "max_tokens": 33,
        "ignore_eos": True, "stop": ["\n\n", "User:"]}
    assert type(body["stop"]) is list


def test_seed_zero_is_present_and_unset_seed_is_absent():
    assert request_body(request(seed=0))["seed"] == 0
    assert "seed" not in request_body(request())


def test_return_token_ids_is_carried():
    req = request()
    req.return_token_ids = True
    assert request_body(req)["return_token_ids"] is True


def test_stop_token_ids_are_not_a_client_field():
    assert "stop_token_ids" not in request_body(request(stop_token_ids=[5]))


# --- the parser accepts what request_body makes -------------------------------------------------------------


def test_parser_accepts_the_minimal_body_as_greedy():
    chat = parse_chat_request(request_body(request()), limits=LIMITS)
    assert chat.messages == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert chat.sampling == SamplingParams(temperature=0.0, max_tokens=LIMITS.default_max_tokens)
    assert (chat.image_urls, chat.stop, chat.stream, chat.return_token_ids) == ([], (), False, False)


def test_parser_accepts_a_full_body():
    req = request(message(router_pb2.ROLE_SYSTEM, text("be brief")),
                  message(router_pb2.ROLE_USER, router_pb2.ContentPart(image_bytes=PNG_BYTES), text("describe")),
                  temperature=0.5, top_p=0.25, top_k=7, seed=42, max_tokens=33, ignore_eos=True, stop=["User:"])
    req.return_token_ids = True
    chat = parse_chat_request(request_body(req), limits=LIMITS)
    assert chat.messages == [{"role": "system", "content": [{"type": "text", "text": "be brief"}]},
                             {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "describe"}]}]
    assert chat.image_urls == ["data:image/unknown;base64," + base64.b64encode(PNG_BYTES).decode()]
    assert chat.sampling == SamplingParams(temperature=0.5, top_p=0.25, top_k=7, seed=42, max_tokens=33,
                                           ignore_eos=True)
    assert chat.stop == ("User:",)
    assert chat.return_token_ids is True


def test_parser_refuses_an_unspecified_role():
    with pytest.raises(RequestError) as info:
        parse_chat_request(request_body(request(message(router_pb2.ROLE_UNSPECIFIED, text("x")))), limits=LIMITS)
    assert (info.value.status, info.value.param) == (400, "messages[0].role")
    assert "role 'role#0' is not supported" in info.value.message


def test_parser_refuses_a_message_without_parts():
    with pytest.raises(RequestError) as info:
        parse_chat_request(request_body(request(message(router_pb2.ROLE_USER))), limits=LIMITS)
    assert (info.value.status, info.value.param) == (400, "messages[0].content")


def test_parser_refuses_an_image_in_an_assistant_message():
    req = request(message(router_pb2.ROLE_ASSISTANT, router_pb2.ContentPart(image_url="https://x/a.png")))
    with pytest.raises(RequestError, match="images are only allowed in user messages"):
        parse_chat_request(request_body(req), limits=LIMITS)


@pytest.mark.parametrize("sampling, param", [
    ({"temperature": 2.5}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"max_tokens": LIMITS.max_tokens_limit + 1}, "max_tokens"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
])
def test_parser_refuses_out_of_range_sampling(sampling, param):
    with pytest.raises(RequestError) as info:
        parse_chat_request(request_body(request(**sampling)), limits=LIMITS)
    assert (info.value.status, info.value.param) == (400, param)


def test_no_messages_is_refused():
    req = router_pb2.GenerateRequest()
    assert request_body(req)["messages"] == []
    with pytest.raises(RequestError) as info:
        parse_chat_request(request_body(req), limits=LIMITS)
    assert info.value.param == "messages"
