"""count_images: image parts across chat messages."""

from __future__ import annotations

from epd.chat import count_images


def test_no_messages():
    assert count_images([]) == 0


def test_string_content_is_never_an_image():
    messages = [
        {"role": "system", "content": "you see images"},
        {"role": "user", "content": "image image_url"},
    ]
    assert count_images(messages) == 0


def test_list_content_without_images():
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "x"}]}]
    assert count_images(messages) == 0


def test_image_and_image_url_parts_both_count():
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image", "image": "a.png"},
                {"type": "text", "text": "compare with"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        }
    ]
    assert count_images(messages) == 2


def test_counts_across_messages_mixed_content():
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]},
        {"role": "assistant", "content": "a cat"},
        {"role": "user", "content": [{"type": "image_url"}, {"type": "image"}, {"type": "video"}]},
    ]
    assert count_images(messages) == 3


def test_missing_or_none_content():
    assert count_images([{"role": "assistant"}, {"role": "assistant", "content": None}]) == 0
