"""The in-process path equals transformers' greedy `generate`, token for token, for both families."""

from __future__ import annotations

import pytest

from epd.engine.pipeline import InProcessPipeline
from epd.engine.sampling import SamplingParams
from tests.model.conftest import FAMILIES, reference_generate, sample_images, user_message

NEW_TOKENS = 40
CASES = {"text_only": 0, "one_image": 1, "two_images": 2}


@pytest.fixture(scope="module")
def pipelines(tiny_dirs):
    return {fam: InProcessPipeline(path) for fam, path in tiny_dirs.items()}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("case", CASES)
def test_greedy_equals_transformers(family, case, tiny_dirs, pipelines):
    images = sample_images()[: CASES[case]]
    text = "Describe what you see in detail." if images else "Tell me about the morning light."
    expected, expected_prompt_len = reference_generate(
        tiny_dirs[family], [user_message(len(images), text, with_pixels=images)], NEW_TOKENS
    )
    result = pipelines[family].chat([user_message(len(images), text)], images, SamplingParams(max_tokens=NEW_TOKENS))

    assert len(expected) >= 32, "reference stopped early; the comparison would be too short to mean much"
    assert len(set(expected)) >= 8, f"reference output barely varies ({expected}); weights are degenerate"
    assert result.prompt_tokens == expected_prompt_len
    assert result.token_ids == expected


def test_two_images_differ_from_one(tiny_dirs, pipelines):
    """The second image reaches the model: dropping it changes the output."""
    images = sample_images()
    pipe = pipelines["qwen3_vl_moe"]
    both = pipe.chat([user_message(2, "Compare them.")], images, SamplingParams(max_tokens=16))
    swapped = pipe.chat([user_message(2, "Compare them.")], images[::-1], SamplingParams(max_tokens=16))
    assert both.token_ids != swapped.token_ids


def test_seeded_sampling_is_reproducible(pipelines):
    pipe = pipelines["kimi_k25"]
    messages = [user_message(1, "What colour is it?")]
    images = sample_images()[:1]
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, seed=1234, max_tokens=24, ignore_eos=True)
    first = pipe.chat(messages, images, params)
    again = pipe.chat(messages, images, params)
    other = pipe.chat(messages, images, SamplingParams(**{**params.__dict__, "seed": 99}))
    assert first.token_ids == again.token_ids
    assert first.token_ids != other.token_ids
    assert len(first.token_ids) == 24 and first.finish_reason == "length"
