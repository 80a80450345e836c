"""The direct decode forward (epd.engine.direct_decode) gives the module path's logits bit for bit, at
every decode-only step of a run that covers its branches: 1 to 40 sequences (past the native products'
16 rows, and past the pairs moe_decode takes, where the experts' own forward runs), prompts with
images (M-RoPE positions offset past them), and where it does not apply the engine keeps the modules."""

from __future__ import annotations

import pytest
import torch

from epd.chat import render_prompt
from epd.engine.engine import EngineConfig
from epd.engine.params import SamplingParams
from epd.engine.pipeline import InProcessPipeline
from tests.model.conftest import FAMILIES, sample_images, user_message

TEXTS = ["Describe the picture.", "What colours are there?", "Hi.", "Tell me a story about the sea."]


class BothPaths:
    """Stands in for the runner's direct forward: runs it and the modules on the same step, keeps both."""

    def __init__(self, direct, model) -> None:
        self.direct, self.model = direct, model
        self.steps: list[tuple[int, bool]] = []  # (decodes in the step, logits equal bit for bit)

    def takes(self, token_ids: list[int]) -> bool:
        return self.direct.takes(token_ids)

    def __call__(self, input_ids, position_ids, cache, layout, keep) -> torch.Tensor:
        direct = self.direct(input_ids, position_ids, cache, layout, keep)
        # Writing the step's keys and values again writes the same values to the same slots.
        modules = self.model(input_ids=input_ids, position_ids=position_ids, cache=cache, use_cache=True,
                             mm_encoder_outputs=None, logits_to_keep=keep, epd_layout=layout).logits
        self.steps.append((input_ids.shape[1], torch.equal(direct, modules)))
        return modules


def _sequences(pipe: InProcessPipeline, count: int) -> list:
    images = sample_images()
    seqs = []
    for i in range(count):
        n_images = i % 3
        prompt = render_prompt(pipe.tokenizer, [user_message(n_images, TEXTS[i % len(TEXTS)])])
        params = SamplingParams(max_tokens=16 if i < 2 else 3 + i % 7, ignore_eos=True)  # the last steps: 1-2
        seqs.append(pipe.sequence(prompt, (images * 2)[i % 2:i % 2 + n_images], params))
    return seqs


@pytest.mark.parametrize("family", FAMILIES)
def test_every_decode_step_equals_the_module_path(family, tiny_dirs):
    pipe = InProcessPipeline(tiny_dirs[family], EngineConfig(num_blocks=1024, block_size=4, kernels="native"))
    runner = pipe.engine.runner
    assert runner.direct is not None, "the native float32 engine should build the direct decode forward"
    both = runner.direct = BothPaths(runner.direct, pipe.engine.language.model)
    seqs = _sequences(pipe, 40)
    pipe.engine.run_to_completion(seqs)
    sizes = {decodes for decodes, _ in both.steps}
    assert all(equal for _, equal in both.steps), f"direct logits differ at steps of {sorted(sizes)} decodes"
    top_k = pipe.engine.language.config.get_text_config().num_experts_per_tok
    max_pairs = runner.direct.direct.layers[-1].mlp.experts.max_pairs
    assert max(sizes) * top_k > max_pairs, "no step had more pairs than moe_decode takes"
    assert min(sizes) <= 2 and max(sizes) > 16, f"decode batches {sorted(sizes)} miss a branch"


@pytest.mark.parametrize("family", FAMILIES)
def test_the_direct_and_module_engines_generate_the_same_tokens(family, tiny_dirs):
    def generate(direct: bool) -> list[list[int]]:
        pipe = InProcessPipeline(tiny_dirs[family], EngineConfig(num_blocks=512, block_size=4, kernels="native",
                                                                  direct_decode=direct))
        assert (pipe.engine.runner.direct is not None) is direct
        seqs = _sequences(pipe, 6)
        pipe.engine.run_to_completion(seqs)
        return [s.token_ids[s.num_prompt_tokens:] for s in seqs]

    assert generate(True) == generate(False)


@pytest.mark.parametrize("family", FAMILIES)
def test_torch_kernels_keep_the_module_path(family, tiny_dirs):
    pipe = InProcessPipeline(tiny_dirs[family], EngineConfig(num_blocks=64, block_size=4, kernels="torch"))
    assert pipe.engine.runner.direct is None
