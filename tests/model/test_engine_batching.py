"""The engine under batching equals transformers' greedy `generate`, token for token, for both families:
sequences of mixed lengths and images admitted at different steps, prompts long enough to be
chunked (image rows split across chunks), and sequences preempted and resumed."""

from __future__ import annotations

import random
from functools import cache

import pytest
from PIL import Image
from prometheus_client import REGISTRY

from epd.chat import render_prompt
from epd.engine.engine import EngineConfig
from epd.engine.params import SamplingParams
from epd.engine.pipeline import InProcessPipeline
from epd.engine.scheduler import SchedulerConfig
from epd.engine.sequence import Finish
from tests.model.conftest import FAMILIES, reference_generate, sample_images, user_message

NEW_TOKENS = 24
TEXTS = ["Describe the picture.", "What colours are there, and where? Answer in a long sentence please.",
         "Hi.", "Tell me a story about the sea and the small red house that stands next to it."]


def _requests() -> list[tuple[int, str]]:
    """(number of images, text) per request: text-only, one image, two images; short and long."""
    return [(0, TEXTS[0]), (1, TEXTS[1]), (2, TEXTS[2]), (1, TEXTS[3]), (0, TEXTS[3]), (2, TEXTS[1])]


@cache
def _reference(model_dir: str, index: int) -> tuple[int, ...]:
    count, text = _requests()[index]
    ids, _ = reference_generate(model_dir, [user_message(count, text, with_pixels=_images(index))], NEW_TOKENS)
    assert len(ids) >= 16 and len(set(ids)) >= 6, f"reference {ids} too short or degenerate to compare"
    return tuple(ids)


def _images(index: int) -> list[Image.Image]:
    count, _ = _requests()[index]
    images = sample_images()
    return (images[index % 2:] + images[:index % 2])[:count]


def _pipeline(model_dir: str, **engine) -> InProcessPipeline:
    return InProcessPipeline(model_dir, EngineConfig(**engine))


def _sequence(pipe: InProcessPipeline, index: int):
    count, text = _requests()[index]
    prompt = render_prompt(pipe.tokenizer, [user_message(count, text)])
    return pipe.sequence(prompt, _images(index), SamplingParams(max_tokens=NEW_TOKENS))


def _run_staggered(pipe: InProcessPipeline, order: list[int], every: int) -> dict[int, list[int]]:
    """Add one request every `every` steps (the rest arrive while others decode), run all to the end."""
    seqs = {index: _sequence(pipe, index) for index in order}
    pending = list(order)
    steps = 0
    while pending or any(s.finish is None for s in seqs.values()):
        if pending and steps % every == 0:
            pipe.engine.add(seqs[pending.pop(0)])
        pipe.engine.step()
        steps += 1
        assert steps < 2000, "the engine stopped making progress"
    assert pipe.engine.blocks.num_used_blocks == 0, "blocks leaked after every sequence finished"
    return {i: s.token_ids[s.num_prompt_tokens:] for i, s in seqs.items()}


@pytest.mark.parametrize("kernels", ["native", "torch"])
@pytest.mark.parametrize("family", FAMILIES)
def test_mixed_requests_admitted_at_different_steps(family, kernels, tiny_dirs):
    """Both kernel sets: ours (decode attention reading the pool in place, fused RMSNorm, MoE combine), torch's."""
    from epd.engine import onednn_linear
    from epd.engine.ungrouped_router import ROUTER_CLASSES, ungrouped_router_forward
    from epd.models.experts import NAME, NATIVE_NAME, ONEDNN_NAME

    pipe = _pipeline(tiny_dirs[family], num_blocks=256, block_size=4, kernels=kernels)
    assert pipe.engine.runner.decode_in_place is (kernels == "native")
    experts = {m.config._experts_implementation for m in pipe.engine.language.model.modules()
               if hasattr(m, "gate_up_proj") and hasattr(m, "config")}
    native = ONEDNN_NAME if onednn_linear.available() else NATIVE_NAME  # float32: prompt products through oneDNN
    assert experts == {native if kernels == "native" else NAME}
    routers = [m for m in pipe.engine.language.model.modules() if type(m).__name__ in ROUTER_CLASSES]
    assert bool(routers) is (family == "kimi_k25")  # Kimi's (n_group 1); Qwen's router has no groups
    assert all(m.forward.__func__ is ungrouped_router_forward for m in routers)
    got = _run_staggered(pipe, order=[3, 0, 5, 1, 4, 2], every=3)
    for index, tokens in got.items():
        assert tokens == list(_reference(tiny_dirs[family], index)), f"request {index} differs"


@pytest.mark.parametrize("family", FAMILIES)
def test_decodes_padded_past_every_context_give_the_same_tokens(family, tiny_dirs):
    """The common length rounded up (as for bfloat16 on a CPU) leaves every sequence masked padding."""
    pipe = _pipeline(tiny_dirs[family], num_blocks=256, block_size=4)
    pipe.engine.runner.decode_length_step = 16
    got = _run_staggered(pipe, order=[1, 4, 0, 3], every=2)
    for index, tokens in got.items():
        assert tokens == list(_reference(tiny_dirs[family], index)), f"request {index} differs"


@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_prefill_splits_prompts_and_images(family, tiny_dirs):
    """Chunks of 7 tokens with a 20-token budget: image rows fall on both sides of chunk boundaries."""
    pipe = _pipeline(tiny_dirs[family], num_blocks=256, block_size=4,
                     scheduler=SchedulerConfig(max_batched_tokens=20, max_prefill_chunk=7))
    seqs = [_sequence(pipe, i) for i in (5, 1, 3)]
    assert all(s.num_prompt_tokens > 14 for s in seqs), "prompts must span several chunks"
    pipe.engine.run_to_completion(seqs)
    for index, s in zip((5, 1, 3), seqs, strict=True):
        assert s.token_ids[s.num_prompt_tokens:] == list(_reference(tiny_dirs[family], index))


@pytest.mark.parametrize("kernels", ["native", "torch"])
@pytest.mark.parametrize("family", FAMILIES)
def test_preempted_sequences_resume_to_the_same_tokens(family, kernels, tiny_dirs):
    order = [5, 1, 3, 0]
    sizer = _pipeline(tiny_dirs[family], num_blocks=256, block_size=4)
    needs = [sizer.engine.blocks.blocks_for(_sequence(sizer, i).max_total_tokens) for i in order]
    # Enough blocks for any one request to finish, far from enough for all of them together.
    pipe = _pipeline(tiny_dirs[family], num_blocks=max(needs) + 3, block_size=4, kernels=kernels)
    assert sum(needs) > max(needs) + 2
    counted = REGISTRY.get_sample_value("epd_scheduler_preemptions_total", {"role": "in_process"}) or 0.0
    got = _run_staggered(pipe, order=order, every=1)
    assert pipe.engine.scheduler.num_preemptions >= 1, "the pool was large enough: nothing was preempted"
    assert REGISTRY.get_sample_value("epd_scheduler_preemptions_total", {"role": "in_process"}) == \
        counted + pipe.engine.scheduler.num_preemptions
    for index in order:
        assert got[index] == list(_reference(tiny_dirs[family], index)), f"request {index} differs"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_repeated_prompt_hits_the_prefix_cache_and_gives_the_same_tokens(family, tiny_dirs):
    pipe = _pipeline(tiny_dirs[family], num_blocks=256, block_size=4)
    first = _sequence(pipe, 3)
    pipe.engine.run_to_completion([first])
    assert first.num_cached_tokens == 0
    again = _sequence(pipe, 3)
    pipe.engine.run_to_completion([again])
    assert again.num_cached_tokens >= again.num_prompt_tokens - 4  # all but the last, partial block
    assert again.token_ids[again.num_prompt_tokens:] == list(_reference(tiny_dirs[family], 3))


def test_random_arrivals_and_aborts_leak_no_block(tiny_dirs):
    """Against the model: random adds, aborts mid-prefill and mid-decode, a small pool; every block back."""
    rng = random.Random(3)
    pipe = _pipeline(tiny_dirs["qwen3_vl_moe"], num_blocks=48, block_size=4,
                     scheduler=SchedulerConfig(max_batched_tokens=24, max_prefill_chunk=9))
    live, finished = [], 0
    for _ in range(160):
        if rng.random() < 0.3 and len(live) < 6:
            s = _sequence(pipe, rng.randrange(len(_requests())))
            pipe.engine.add(s)
            live.append(s)
        if live and rng.random() < 0.08:
            pipe.engine.abort(live.pop(rng.randrange(len(live))))
        pipe.engine.step()
        finished += sum(1 for s in live if s.finish is not None)
        live = [s for s in live if s.finish is None]
        used = sum(len(s.block_table) for s in pipe.engine.scheduler.running)
        assert pipe.engine.blocks.num_used_blocks <= used  # shared prefix blocks count once
    for s in live:
        pipe.engine.abort(s)
    assert finished >= 3
    assert pipe.engine.blocks.num_used_blocks == 0
    assert not pipe.engine.has_work and all(s.finish is Finish.CANCELLED for s in live)


def test_every_step_is_timed_by_kind(tiny_dirs):
    """`epd_step_seconds{role,kind}` counts each step once: a prompt's chunks as `prompt` (its last,
    one-token chunk too), the rest as `decode`."""
    count, text = _requests()[1]

    def sequence(pipe):
        prompt = render_prompt(pipe.tokenizer, [user_message(count, text)])
        return pipe.sequence(prompt, _images(1), SamplingParams(max_tokens=5, ignore_eos=True))

    prompt_len = sequence(_pipeline(tiny_dirs["kimi_k25"], num_blocks=256)).num_prompt_tokens
    # Chunks of all but one token: the prompt's last chunk is one token, as a decode step's are.
    pipe = _pipeline(tiny_dirs["kimi_k25"], num_blocks=256, block_size=4,
                     scheduler=SchedulerConfig(max_batched_tokens=prompt_len, max_prefill_chunk=prompt_len - 1))

    def counted(kind: str) -> float:
        return REGISTRY.get_sample_value("epd_step_seconds_count", {"role": "in_process", "kind": kind}) or 0.0

    before = {kind: counted(kind) for kind in ("prompt", "decode")}
    pipe.engine.run_to_completion([sequence(pipe)])
    assert counted("prompt") - before["prompt"] == 2
    assert counted("decode") - before["decode"] == 4  # the first token comes with the prompt's last chunk


@pytest.mark.parametrize("family", FAMILIES)
def test_the_last_layer_for_sampled_rows_only_gives_the_same_tokens(family, tiny_dirs):
    """Chunked prompts (chunks that do not sample skip the last layer's attention and MLP), decodes
    beside them: the same tokens as the engine computing every row, and as `generate`."""
    chunked = SchedulerConfig(max_batched_tokens=20, max_prefill_chunk=7)
    pruned = _pipeline(tiny_dirs[family], num_blocks=256, block_size=4, scheduler=chunked)
    every = _pipeline(tiny_dirs[family], num_blocks=256, block_size=4, scheduler=chunked, sampled_rows_only=False)
    layers = pruned.engine.language.config.get_text_config().num_hidden_layers
    assert (pruned.engine.runner.sampled_only_layer, every.engine.runner.sampled_only_layer) == (layers - 1, None)
    order = [5, 1, 3]
    got = {name: _run_staggered(pipe, order=order, every=2) for name, pipe in (("pruned", pruned), ("every", every))}
    assert got["pruned"] == got["every"]
    for index in order:
        assert got["pruned"][index] == list(_reference(tiny_dirs[family], index)), f"request {index} differs"


@pytest.mark.parametrize("family", FAMILIES)
def test_a_prompt_steps_last_layer_mlp_sees_only_the_sampled_row(family, tiny_dirs):
    """The engine sets the kept rows for its prompt steps: the last layer's MoE routes the prompt's
    last token alone, the first layer's MLP gets every token (equal tokens alone would not show a
    pruning that never ran)."""
    pipe = _pipeline(tiny_dirs[family], num_blocks=256, block_size=4)
    layers = pipe.engine.language.model.model.language_model.layers
    last = pipe.engine.runner.sampled_only_layer
    seen: dict[str, list[int]] = {"first": [], "last": []}
    # The last MLP's forward is the wrapper; its router (inside) sees the rows the wrapper hands on.
    watched = {"first": layers[0].mlp, "last": layers[last].mlp.gate}
    hooks = [module.register_forward_pre_hook(lambda _, args, name=name: seen[name].append(
                 args[0].numel() // args[0].shape[-1])) for name, module in watched.items()]
    try:
        seq = _sequence(pipe, 1)
        pipe.engine.add(seq)
        pipe.engine.step()  # the whole prompt in one step
    finally:
        for hook in hooks:
            hook.remove()
    assert seen == {"first": [seq.num_prompt_tokens], "last": [1]}
