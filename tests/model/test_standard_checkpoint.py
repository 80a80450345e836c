"""The loader reads checkpoints written by plain transformers code, not only by `make-tiny-model`."""

from __future__ import annotations

import pytest

from epd.engine.pipeline import InProcessPipeline
from epd.engine.sampling import SamplingParams
from tests.model.conftest import reference_generate, sample_images, user_message
from tests.plain_checkpoint import write_plain_qwen_checkpoint


@pytest.fixture(scope="module")
def plain_dir(tmp_path_factory) -> str:
    return write_plain_qwen_checkpoint(tmp_path_factory.mktemp("plain_qwen"))


@pytest.mark.parametrize("num_images", [0, 1, 2])
def test_plain_checkpoint_equals_transformers(plain_dir, num_images):
    images = sample_images()[:num_images]
    expected, prompt_len = reference_generate(plain_dir, [user_message(num_images, "what is in this picture?",
                                                                       with_pixels=images)], 36)
    result = InProcessPipeline(plain_dir).chat(
        [user_message(num_images, "what is in this picture?")], images, SamplingParams(max_tokens=36))
    assert len(expected) >= 32 and len(set(expected)) >= 6
    assert result.prompt_tokens == prompt_len
    assert result.token_ids == expected
