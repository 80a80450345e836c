"""OpenAI chat-completion response shapes (non-streaming body, stream chunks, usage)."""

from __future__ import annotations

import time

from router.completion import Final


def usage(final: Final) -> dict:
    return {"prompt_tokens": final.prompt_tokens, "completion_tokens": final.completion_tokens,
            "total_tokens": final.prompt_tokens + final.completion_tokens}


def completion_body(request_id: str, model: str, text: str, token_ids: list[int], final: Final,
                    prompt_ids: list[int] | None) -> dict:
    choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": final.finish_reason,
              "logprobs": None}
    body = {"id": request_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [choice], "usage": usage(final)}
    if prompt_ids is not None:  # return_token_ids, as vLLM spells it
        choice["token_ids"] = token_ids
        body["prompt_token_ids"] = prompt_ids
    return body


def chunk(request_id: str, model: str, created: int, delta: dict, finish_reason: str | None = None,
          token_ids: list[int] | None = None, prompt_token_ids: list[int] | None = None) -> dict:
    """One stream chunk. With return_token_ids, as vLLM spells it: `token_ids` on the choice (not in
    `delta`), `prompt_token_ids` on the chunk (the first one)."""
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    body = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [choice]}
    if prompt_token_ids is not None:
        body["prompt_token_ids"] = prompt_token_ids
    return body


def usage_chunk(request_id: str, model: str, created: int, final: Final) -> dict:
    return {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [], "usage": usage(final)}
