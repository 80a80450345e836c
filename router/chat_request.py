"""Validate an OpenAI `/v1/chat/completions` body into a typed request the router can act on.

Everything a client can get wrong is caught here, before any image is fetched or any worker is
touched, and reported as a 400 whose `param` names the offending field (`messages[1].content[0]
.image_url`), the way OpenAI's own API does. Fields this server cannot honour (tools, logprobs,
penalties) are refused rather than silently ignored, so a client never gets an answer that quietly
differs from what it asked for; fields that change nothing at their neutral value (`"user"`,
`"frequency_penalty": 0`) are accepted because official clients send them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NoReturn

from epd.engine.params import SamplingParams
from router.errors import RequestError

# "developer" is OpenAI's newer name for the system role.
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# torch.Generator.manual_seed accepts exactly this range.
_SEED_MIN, _SEED_MAX = -(2**63), 2**63 - 1  # the wire's `optional int64 seed`


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask for; set by the operator, the same for every client."""

    max_images: int = 8
    max_tokens_limit: int = 4096
    # For requests that name no max_tokens; capped at max_tokens_limit, so an operator lowering
    # the limit alone does not have to lower this too.
    default_max_tokens: int = 256
    max_messages: int = 256
    max_stop: int = 4
    # Stop strings are matched against every streamed chunk; long ones make that costly.
    max_stop_chars: int = 256
    # OpenAI's default; a server that wants greedy-by-default (oracle runs) sets 0.
    default_temperature: float = 1.0

    def __post_init__(self) -> None:
        for name in ("max_tokens_limit", "default_max_tokens", "max_messages", "max_stop_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"RequestLimits.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_images", "max_stop"):
            if getattr(self, name) < 0:
                raise ValueError(f"RequestLimits.{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.default_temperature <= 2.0:
            raise ValueError(f"RequestLimits.default_temperature must be in [0, 2], got {self.default_temperature}")


@dataclass(frozen=True)
class ChatRequest:
    """A validated chat request.

    `messages` is ready for the chat template: content is a string or a list of
    `{"type": "text", "text"}` / `{"type": "image"}` parts, and the i-th image part stands for
    `image_urls[i]`.
    """

    model: str | None
    messages: list[dict]
    image_urls: list[str]
    sampling: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    return_token_ids: bool
    # Where each image came from (`messages[0].content[1].image_url.url`), so that an image the
    # router cannot load is refused with `param` naming it.
    image_params: tuple[str, ...] = ()
    # False when the client named no max_tokens: the router may then shorten the default to fit
    # the model's context instead of refusing.
    max_tokens_given: bool = True


def parse_chat_request(body: object, *, limits: RequestLimits) -> ChatRequest:
    """The typed request for a decoded JSON body, or RequestError (400) naming what is wrong."""
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, got {_json_type(body)}")
    _reject_unsupported(body)
    image_params: list[str] = []
    messages, image_urls = _parse_messages(body.get("messages"), limits, image_params)
    stream = _optional_bool(body, "stream") or False
    return ChatRequest(
        model=_parse_model(body.get("model")),
        messages=messages,
        image_urls=image_urls,
        sampling=_parse_sampling(body, limits),
        stop=_parse_stop(body.get("stop"), limits),
        stream=stream,
        include_usage=_parse_stream_options(body.get("stream_options"), stream),
        return_token_ids=_optional_bool(body, "return_token_ids") or False,
        image_params=tuple(image_params),
        max_tokens_given=body.get("max_tokens") is not None or body.get("max_completion_tokens") is not None,
    )


# --- messages ---------------------------------------------------------------------------------------


def _parse_messages(value: Any, limits: RequestLimits, image_params: list[str]) -> tuple[list[dict], list[str]]:
    """Normalized messages and the image URLs in prompt order."""
    if value is None:
        _fail("messages", "'messages' is required")
    if not isinstance(value, list):
        _fail("messages", f"'messages' must be an array of messages, got {_json_type(value)}")
    if not value:
        _fail("messages", "'messages' must contain at least one message")
    if len(value) > limits.max_messages:
        _fail("messages", f"too many messages: {len(value)}, this server allows at most {limits.max_messages}")
    image_urls: list[str] = []
    messages = [_parse_message(m, f"messages[{i}]", (image_urls, image_params), limits) for i, m in enumerate(value)]
    return messages, image_urls


def _parse_message(message: Any, where: str, images: tuple[list[str], list[str]], limits: RequestLimits) -> dict:
    if not isinstance(message, dict):
        _fail(where, f"'{where}' must be an object, got {_json_type(message)}")
    role = message.get("role")
    if not isinstance(role, str):
        _fail(f"{where}.role", f"'{where}.role' must be a string, got {_json_type(role)}")
    if role not in _ROLES:
        why = " (tool calling is not supported)" if role in ("tool", "function") else ""
        _fail(f"{where}.role", f"role {role!r} is not supported{why}; use 'system', 'user' or 'assistant'")
    if message.get("tool_calls"):
        _fail(f"{where}.tool_calls", "tool calls are not supported by this server")
    content = _parse_content(message.get("content"), f"{where}.content", role, images, limits)
    return {"role": _ROLES[role], "content": content}


def _parse_content(
    content: Any, where: str, role: str, images: tuple[list[str], list[str]], limits: RequestLimits
) -> str | list[dict]:
    if isinstance(content, str):
        return content
    # OpenAI lets an assistant turn have null content (it used to carry only tool calls).
    if content is None and role == "assistant":
        return ""
    if content is None:
        _fail(where, f"'{where}' is required for a {role} message")
    if not isinstance(content, list):
        _fail(where, f"'{where}' must be a string or an array of content parts, got {_json_type(content)}")
    if not content:
        _fail(where, f"'{where}' must not be an empty array")
    return [_parse_part(part, f"{where}[{j}]", role, images, limits) for j, part in enumerate(content)]


def _parse_part(part: Any, where: str, role: str, images: tuple[list[str], list[str]], limits: RequestLimits) -> dict:
    if not isinstance(part, dict):
        _fail(where, f"'{where}' must be an object, got {_json_type(part)}")
    kind = part.get("type")
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            _fail(f"{where}.text", f"'{where}.text' must be a string, got {_json_type(text)}")
        return {"type": "text", "text": text}
    if kind == "image_url":
        if role != "user":
            _fail(where, f"images are only allowed in user messages, not in a {role} message")
        url, url_param = _parse_image_url(part.get("image_url"), f"{where}.image_url")
        image_urls, image_params = images
        if len(image_urls) >= limits.max_images:
            _fail(where, f"too many images: this server allows at most {limits.max_images} per request")
        image_urls.append(url)
        image_params.append(url_param)
        return {"type": "image"}
    if not isinstance(kind, str):
        _fail(f"{where}.type", f"'{where}.type' must be a string, got {_json_type(kind)}")
    _fail(f"{where}.type", f"content part type {kind!r} is not supported; use 'text' or 'image_url'")


def _parse_image_url(value: Any, where: str) -> tuple[str, str]:
    """The URL of an image part and its field; OpenAI's object form and the bare-string shorthand both work."""
    if isinstance(value, dict):
        value, where = value.get("url"), f"{where}.url"
    if not isinstance(value, str) or not value:
        _fail(where, f"'{where}' must be a non-empty string URL, got {_json_type(value)}")
    return value, where


# --- sampling and output ----------------------------------------------------------------------------


def _parse_sampling(body: dict, limits: RequestLimits) -> SamplingParams:
    temperature = _optional_number(body, "temperature")
    if temperature is None:
        temperature = limits.default_temperature
    elif not 0.0 <= temperature <= 2.0:
        _fail("temperature", f"'temperature' must be between 0 and 2, got {temperature}")
    top_p = _optional_number(body, "top_p")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        _fail("top_p", f"'top_p' must be greater than 0 and at most 1, got {top_p}")
    top_k = _optional_int(body, "top_k")
    if top_k is not None and top_k < -1:
        _fail("top_k", f"'top_k' must be -1 or 0 (no limit) or a positive integer, got {top_k}")
    seed = _optional_int(body, "seed")
    if seed is not None and not _SEED_MIN <= seed <= _SEED_MAX:
        _fail("seed", f"'seed' must be a 64-bit integer, got {seed}")
    try:
        return SamplingParams(
            temperature=float(temperature),
            top_p=1.0 if top_p is None else float(top_p),
            top_k=max(top_k or 0, 0),  # vLLM spells "off" as -1, the engine as 0
            seed=seed,
            max_tokens=_parse_max_tokens(body, limits),
            ignore_eos=_optional_bool(body, "ignore_eos") or False,
        )
    except ValueError as exc:  # the checks above should make this unreachable; never a 500 if not
        raise RequestError(str(exc)) from None


def _parse_max_tokens(body: dict, limits: RequestLimits) -> int:
    """`max_completion_tokens` is OpenAI's new name for `max_tokens`; either (or both, agreeing) works."""
    legacy = _optional_int(body, "max_tokens")
    current = _optional_int(body, "max_completion_tokens")
    if legacy is not None and current is not None and legacy != current:
        _fail(
            "max_completion_tokens",
            f"'max_tokens' ({legacy}) and 'max_completion_tokens' ({current}) disagree; send only one of them",
        )
    key, value = ("max_tokens", legacy) if current is None else ("max_completion_tokens", current)
    if value is None:
        return min(limits.default_max_tokens, limits.max_tokens_limit)
    if value < 1:
        _fail(key, f"'{key}' must be at least 1, got {value}")
    if value > limits.max_tokens_limit:
        _fail(key, f"'{key}' is {value}, over this server's limit of {limits.max_tokens_limit}")
    return value


def _parse_stop(value: Any, limits: RequestLimits) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list):
        _fail("stop", f"'stop' must be a string or an array of strings, got {_json_type(value)}")
    if len(stops) > limits.max_stop:
        _fail("stop", f"too many stop sequences: {len(stops)}, this server allows at most {limits.max_stop}")
    for k, stop in enumerate(stops):
        if not isinstance(stop, str) or not stop:
            _fail("stop", f"'stop[{k}]' must be a non-empty string, got {_json_type(stop)}")
        if len(stop) > limits.max_stop_chars:
            _fail("stop", f"'stop[{k}]' is {len(stop)} characters, over the limit of {limits.max_stop_chars}")
    return tuple(dict.fromkeys(stops))  # duplicates change nothing; order kept for readability


def _parse_stream_options(value: Any, stream: bool) -> bool:
    """`stream_options.include_usage`; like OpenAI, options without streaming are an error."""
    if value is None:
        return False
    if not stream:
        _fail("stream_options", "'stream_options' is only allowed when 'stream' is true")
    if not isinstance(value, dict):
        _fail("stream_options", f"'stream_options' must be an object, got {_json_type(value)}")
    include_usage = value.get("include_usage")
    if include_usage is None:
        return False
    if not isinstance(include_usage, bool):
        _fail("stream_options.include_usage", f"'include_usage' must be a boolean, got {_json_type(include_usage)}")
    return include_usage


def _parse_model(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        _fail("model", f"'model' must be a string, got {_json_type(value)}")
    return value


# --- unsupported features ---------------------------------------------------------------------------


def _reject_unsupported(body: dict) -> None:
    """Refuse features this server would otherwise silently ignore; neutral values pass."""
    n = _optional_int(body, "n")
    if n is not None and n != 1:
        _fail("n", f"'n' must be 1 (one choice per request), got {n}")
    if _optional_bool(body, "logprobs"):
        _fail("logprobs", "logprobs are not supported by this server")
    if _optional_int(body, "top_logprobs"):
        _fail("top_logprobs", "logprobs are not supported by this server")
    for key in ("tools", "functions"):
        if body.get(key) not in (None, []):
            _fail(key, f"'{key}' (tool calling) is not supported by this server")
    for key in ("tool_choice", "function_call"):
        if body.get(key) not in (None, "none"):
            _fail(key, f"'{key}' (tool calling) is not supported by this server")
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        _fail("response_format", "only 'response_format': {\"type\": \"text\"} is supported by this server")
    for key in ("frequency_penalty", "presence_penalty"):
        penalty = _optional_number(body, key)
        if penalty:
            _fail(key, f"'{key}' is not supported by this server; send 0 or omit it, got {penalty}")
    logit_bias = body.get("logit_bias")
    if logit_bias not in (None, {}):
        _fail("logit_bias", "'logit_bias' is not supported by this server")


# --- typed field access -----------------------------------------------------------------------------


def _optional_bool(body: dict, key: str) -> bool | None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        _fail(key, f"'{key}' must be a boolean, got {_json_type(value)}")
    return value


def _optional_int(body: dict, key: str) -> int | None:
    value = body.get(key)
    # bool is an int subclass in Python but not in JSON: `"max_tokens": true` is a client bug.
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        _fail(key, f"'{key}' must be an integer, got {_json_type(value)}")
    return value


def _optional_number(body: dict, key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        _fail(key, f"'{key}' must be a number, got {_json_type(value)}")
    # Python's json module accepts NaN and Infinity; no sampling parameter means anything there.
    if not math.isfinite(value):
        _fail(key, f"'{key}' must be a finite number, got {value!r}")
    return value


def _json_type(value: Any) -> str:
    """What the client wrote, in JSON terms (`string 'hot'`, `number 1.5`, `array`), kept short."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int | float):
        text = repr(value)
        return f"number {text if len(text) <= 24 else text[:21] + '...'}"
    if isinstance(value, str):
        # Never echo a long string (a data URL, a prompt) back into an error message.
        return f"string {value[:24]!r}" + ("..." if len(value) > 24 else "")
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _fail(param: str, message: str) -> NoReturn:
    raise RequestError(message, param=param)
