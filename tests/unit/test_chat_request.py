"""parse_chat_request: every accepted shape; refused bodies, messages and content parts."""

from __future__ import annotations

import pytest

from epd.engine.sampling import SamplingParams
from router.chat_request import ChatRequest, RequestLimits
from tests.unit.chat_request_helpers import PNG, assert_refused, parse, user

# --- accepted ---------------------------------------------------------------------------------------


def test_minimal_request_gets_defaults():
    request = parse(user("hi"))
    assert request == ChatRequest(
        model=None,
        messages=[{"role": "user", "content": "hi"}],
        image_urls=[],
        sampling=SamplingParams(temperature=1.0, top_p=1.0, top_k=0, seed=None, max_tokens=256, ignore_eos=False),
        stop=(),
        stream=False,
        include_usage=False,
        return_token_ids=False,
        image_params=(),
        max_tokens_given=False,
    )


def test_image_params_name_each_image_field():
    body = user([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": PNG}},
                 {"type": "image_url", "image_url": PNG}])
    request = parse(body)
    assert request.image_params == ("messages[0].content[1].image_url.url", "messages[0].content[2].image_url")
    assert request.max_tokens_given is False
    assert parse({**body, "max_completion_tokens": 3}).max_tokens_given is True


def test_every_supported_field():
    body = {
        "model": "tiny-kimi",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi"},
            {"role": "user", "content": "again"},
        ],
        "max_tokens": 7,
        "temperature": 0,
        "top_p": 0.5,
        "top_k": 40,
        "seed": 123,
        "stop": ["\n\n", "User:"],
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    request = parse(body)
    assert request.model == "tiny-kimi"
    assert [m["role"] for m in request.messages] == ["system", "user", "assistant", "user"]
    assert request.sampling == SamplingParams(
        temperature=0.0, top_p=0.5, top_k=40, seed=123, max_tokens=7, ignore_eos=True
    )
    assert request.stop == ("\n\n", "User:")
    assert (request.stream, request.include_usage, request.return_token_ids) == (True, True, True)


def test_image_parts_become_placeholders_in_order():
    body = {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "look"}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "compare"},
                    {"type": "image_url", "image_url": {"url": "https://a.example/1.png", "detail": "high"}},
                    {"type": "text", "text": "with"},
                    {"type": "image_url", "image_url": PNG},
                ],
            },
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://b.example/3.jpg"}}]},
        ]
    }
    request = parse(body)
    assert request.messages == [
        {"role": "system", "content": [{"type": "text", "text": "look"}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "compare"},
                {"type": "image"},
                {"type": "text", "text": "with"},
                {"type": "image"},
            ],
        },
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "image"}]},
    ]
    assert request.image_urls == ["https://a.example/1.png", PNG, "http://b.example/3.jpg"]


def test_developer_role_is_system():
    request = parse({"messages": [{"role": "developer", "content": "rules"}, {"role": "user", "content": "x"}]})
    assert request.messages[0] == {"role": "system", "content": "rules"}


def test_assistant_with_null_content_is_empty_text():
    request = parse({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": None}]})
    assert request.messages[1] == {"role": "assistant", "content": ""}


def test_extra_message_fields_are_dropped():
    request = parse({"messages": [{"role": "user", "content": "a", "name": "bob"}]})
    assert request.messages == [{"role": "user", "content": "a"}]


def test_max_images_exactly_at_the_limit():
    parts = [{"type": "image_url", "image_url": PNG}] * 2
    request = parse(user(parts), RequestLimits(max_images=2))
    assert request.image_urls == [PNG, PNG]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"max_tokens": 5}, 5),
        ({"max_completion_tokens": 6}, 6),
        ({"max_tokens": 9, "max_completion_tokens": 9}, 9),
        ({"max_tokens": None, "max_completion_tokens": 4}, 4),
        ({"max_tokens": 4096}, 4096),
        ({}, 256),
    ],
)
def test_max_tokens_spellings(fields, expected):
    assert parse({**user("x"), **fields}).sampling.max_tokens == expected


def test_default_max_tokens_and_temperature_come_from_limits():
    sampling = parse(user("x"), RequestLimits(default_max_tokens=3, default_temperature=0.0)).sampling
    assert (sampling.max_tokens, sampling.temperature) == (3, 0.0)


def test_default_max_tokens_is_capped_by_the_limit():
    assert parse(user("x"), RequestLimits(max_tokens_limit=100)).sampling.max_tokens == 100


@pytest.mark.parametrize(("top_k", "expected"), [(-1, 0), (0, 0), (1, 1), (50, 50)])
def test_top_k_off_spellings(top_k, expected):
    assert parse({**user("x"), "top_k": top_k}).sampling.top_k == expected


@pytest.mark.parametrize(("temperature", "expected"), [(0, 0.0), (2, 2.0), (0.7, 0.7)])
def test_temperature_bounds_inclusive(temperature, expected):
    assert parse({**user("x"), "temperature": temperature}).sampling.temperature == expected


def test_top_p_one_is_allowed():
    assert parse({**user("x"), "top_p": 1}).sampling.top_p == 1.0


@pytest.mark.parametrize(("stop", "expected"), [("END", ("END",)), ([], ()), (None, ()), (["a", "b", "a"], ("a", "b"))])
def test_stop_forms(stop, expected):
    assert parse({**user("x"), "stop": stop}).stop == expected


def test_neutral_values_of_unsupported_features_pass():
    body = {
        **user("x"),
        "user": "someone",
        "frequency_penalty": 0,
        "presence_penalty": 0.0,
        "logit_bias": {},
        "logprobs": False,
        "top_logprobs": 0,
        "n": 1,
        "tools": [],
        "tool_choice": "none",
        "response_format": {"type": "text"},
        "parallel_tool_calls": False,
        "something_new": {"x": 1},
    }
    assert parse(body).messages == [{"role": "user", "content": "x"}]


def test_stream_options_without_include_usage():
    request = parse({**user("x"), "stream": True, "stream_options": {}})
    assert (request.stream, request.include_usage) == (True, False)


# --- refused: body and messages ---------------------------------------------------------------------


@pytest.mark.parametrize("body", [[], "hi", 3, None])
def test_body_must_be_an_object(body):
    assert_refused(body, None, "must be a JSON object")


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        (None, "'messages' is required"),
        ({}, "must be an array of messages, got object"),
        ("hi", "must be an array of messages, got string"),
        ([], "at least one message"),
    ],
)
def test_messages_shape(messages, fragment):
    body = {} if messages is None else {"messages": messages}
    assert_refused(body, "messages", fragment)


def test_too_many_messages():
    body = {"messages": [{"role": "user", "content": "x"}] * 3}
    assert_refused(body, "messages", "at most 2", RequestLimits(max_messages=2))


def test_message_must_be_object():
    assert_refused({"messages": [{"role": "user", "content": "x"}, "hello"]}, "messages[1]", "must be an object")


@pytest.mark.parametrize(
    ("role", "fragment"),
    [
        ("tool", "role 'tool' is not supported (tool calling is not supported)"),
        ("function", "role 'function' is not supported"),
        ("robot", "role 'robot' is not supported; use 'system', 'user' or 'assistant'"),
    ],
)
def test_unsupported_roles(role, fragment):
    assert_refused({"messages": [{"role": role, "content": "x"}]}, "messages[0].role", fragment)


def test_missing_role():
    assert_refused({"messages": [{"content": "x"}]}, "messages[0].role", "must be a string, got null")


def test_assistant_tool_calls_refused():
    body = {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]}
    assert_refused(body, "messages[0].tool_calls", "tool calls are not supported")


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (None, "is required for a user message"),
        (5, "must be a string or an array of content parts, got number 5"),
        ({"type": "text"}, "got object"),
        ([], "must not be an empty array"),
    ],
)
def test_content_shape(content, fragment):
    assert_refused(user(content), "messages[0].content", fragment)


def test_part_must_be_object():
    assert_refused(user(["hi"]), "messages[0].content[0]", "must be an object, got string")


def test_text_part_needs_string_text():
    parts = [{"type": "text", "text": "ok"}, {"type": "text", "text": 3}]
    assert_refused(user(parts), "messages[0].content[1].text", "must be a string, got number 3")


def test_unknown_part_type():
    parts = [{"type": "input_audio", "input_audio": {}}]
    fragment = "'input_audio' is not supported; use 'text' or 'image_url'"
    assert_refused(user(parts), "messages[0].content[0].type", fragment)


def test_part_without_type():
    assert_refused(user([{"text": "x"}]), "messages[0].content[0].type", "must be a string, got null")


@pytest.mark.parametrize(
    ("image_url", "param", "fragment"),
    [
        (None, "messages[1].content[0].image_url", "must be a non-empty string URL, got null"),
        ("", "messages[1].content[0].image_url", "got string ''"),
        (7, "messages[1].content[0].image_url", "got number 7"),
        ({}, "messages[1].content[0].image_url.url", "got null"),
        ({"url": ["x"]}, "messages[1].content[0].image_url.url", "got array"),
    ],
)
def test_bad_image_url(image_url, param, fragment):
    body = {
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "image_url", "image_url": image_url}]},
        ]
    }
    assert_refused(body, param, fragment)


@pytest.mark.parametrize("role", ["system", "assistant", "developer"])
def test_images_only_in_user_messages(role):
    body = {"messages": [{"role": role, "content": [{"type": "image_url", "image_url": PNG}]}]}
    assert_refused(body, "messages[0].content[0]", f"only allowed in user messages, not in a {role} message")


def test_too_many_images_names_the_first_extra_one():
    body = {
        "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": PNG}]},
            {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": PNG}]},
        ]
    }
    assert_refused(body, "messages[1].content[1]", "at most 1 per request", RequestLimits(max_images=1))
