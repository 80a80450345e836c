"""The JSON schema of a chat completion request, for the gateway's OpenAPI document.

The handler reads the raw body itself (router.chat_request validates it, with OpenAI's errors), so
FastAPI cannot infer this: it is written out here, with this server's limits as the bounds, so
that clients, code generators and the schema fuzzer (tests/e2e/test_fuzz_openapi.py) see what it
really accepts.
"""

from __future__ import annotations

from router.chat_request import RequestLimits

_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
_IMAGE_PART = {"type": "object", "required": ["type", "image_url"], "properties": {
    "type": {"const": "image_url"},
    "image_url": {"oneOf": [
        {"type": "string", "minLength": 1},
        {"type": "object", "required": ["url"], "properties": {"url": {"type": "string", "minLength": 1},
                                                               "detail": {"type": "string"}}},
    ]}}}


def chat_request_schema(limits: RequestLimits, model: str) -> dict:
    content = {"oneOf": [{"type": "string"},
                         {"type": "array", "minItems": 1, "items": {"oneOf": [_TEXT_PART, _IMAGE_PART]}}]}
    message = {"type": "object", "required": ["role"], "properties": {
        "role": {"enum": ["system", "developer", "user", "assistant"]}, "content": content,
        "name": {"type": "string"}}}
    max_tokens = {"type": "integer", "minimum": 1, "maximum": limits.max_tokens_limit}
    stop = {"oneOf": [{"type": "string", "minLength": 1, "maxLength": limits.max_stop_chars},
                      {"type": "array", "maxItems": limits.max_stop,
                       "items": {"type": "string", "minLength": 1, "maxLength": limits.max_stop_chars}},
                      {"type": "null"}]}
    return {"type": "object", "required": ["messages"], "properties": {
        "model": {"enum": [model]},
        "messages": {"type": "array", "minItems": 1, "maxItems": limits.max_messages, "items": message},
        "max_tokens": max_tokens,
        "max_completion_tokens": max_tokens,
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": -1, "description": "vLLM's; -1 or 0: no limit"},
        "seed": {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1},
        "stop": stop,
        "n": {"const": 1},
        "stream": {"type": "boolean"},
        "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}},
                           "description": "only with stream: true"},
        "ignore_eos": {"type": "boolean", "description": "vLLM's"},
        "return_token_ids": {"type": "boolean", "description": "vLLM's: token_ids and prompt_token_ids"},
        "frequency_penalty": {"const": 0},
        "presence_penalty": {"const": 0},
        "user": {"type": "string"},
    }}


def openapi_extra(limits: RequestLimits, model: str) -> dict:
    body = {"required": True, "content": {"application/json": {"schema": chat_request_schema(limits, model)}}}
    errors = {"description": "an OpenAI error body naming the field (`error.param`)"}
    return {"requestBody": body, "responses": {"400": errors, "401": errors, "413": errors, "429": errors}}
