"""Prompt rendering with the checkpoint's own chat template, one placeholder token per image part."""

from __future__ import annotations


def render_prompt(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of the templated conversation, as `processor.apply_chat_template` renders it."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the checkpoint has no chat template (chat_template.jinja or tokenizer_config.json)")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def count_images(messages: list[dict]) -> int:
    """Number of image parts across all messages."""
    return sum(
        1
        for m in messages
        if not isinstance(m.get("content"), str)
        for part in m.get("content") or []
        if isinstance(part, dict) and part.get("type") in ("image", "image_url")
    )
