"""decode_loop with a scripted step function: stop conditions and step-call accounting."""

from __future__ import annotations

import torch

from epd.engine.generate import Generation, decode_loop
from epd.engine.sampling import SamplingParams

VOCAB = 10
EOS = 9


def _one_hot(token: int) -> torch.Tensor:
    logits = torch.full((VOCAB,), -5.0)
    logits[token] = 5.0
    return logits


class ScriptedStep:
    """Returns logits whose argmax is the next scripted token; records what it was fed."""

    def __init__(self, script: list[int]) -> None:
        self.script = script
        self.fed: list[int] = []

    def __call__(self, token: int) -> torch.Tensor:
        self.fed.append(token)
        return _one_hot(self.script[len(self.fed)])


def _run(script: list[int], eos=(EOS,), **params) -> tuple[Generation, ScriptedStep]:
    step = ScriptedStep(script)
    gen = decode_loop(_one_hot(script[0]), step, SamplingParams(**params), eos)
    return gen, step


def test_stops_on_eos_and_includes_it():
    gen, step = _run([3, 4, 5, EOS, 6, 7], max_tokens=16)
    assert gen == Generation([3, 4, 5, EOS], "stop")
    assert step.fed == [3, 4, 5]
    assert len(step.fed) == len(gen.token_ids) - 1


def test_eos_as_first_token():
    gen, step = _run([EOS, 1], max_tokens=16)
    assert gen == Generation([EOS], "stop")
    assert step.fed == []


def test_any_of_several_eos_ids_stops():
    gen, step = _run([1, 2, 8, 3], eos=[8, EOS], max_tokens=16)
    assert gen == Generation([1, 2, 8], "stop")
    assert len(step.fed) == 2


def test_eos_ids_as_a_generator():
    gen, _ = _run([1, EOS, 2], eos=(t for t in [EOS]), max_tokens=16)
    assert gen == Generation([1, EOS], "stop")


def test_stops_on_max_tokens():
    gen, step = _run([1, 2, 3, 4, 5, 6, 7], max_tokens=4)
    assert gen == Generation([1, 2, 3, 4], "length")
    assert step.fed == [1, 2, 3]


def test_max_tokens_one_never_steps():
    gen, step = _run([1, 2], max_tokens=1)
    assert gen == Generation([1], "length")
    assert step.fed == []


def test_eos_on_the_last_allowed_token_is_stop():
    gen, step = _run([1, 2, EOS, 3], max_tokens=3)
    assert gen == Generation([1, 2, EOS], "stop")
    assert len(step.fed) == 2


def test_ignore_eos_continues_past_eos():
    gen, step = _run([1, EOS, 2, EOS, 3, 4], max_tokens=5, ignore_eos=True)
    assert gen == Generation([1, EOS, 2, EOS, 3], "length")
    assert step.fed == [1, EOS, 2, EOS]
    assert len(step.fed) == len(gen.token_ids) - 1


def test_no_eos_ids():
    gen, step = _run([EOS, EOS, EOS], eos=(), max_tokens=3)
    assert gen == Generation([EOS, EOS, EOS], "length")
    assert len(step.fed) == 2


def test_seeded_sampling_is_reproducible_through_the_loop():
    uniform = torch.zeros(1000)

    def run() -> list[int]:
        calls: list[int] = []

        def step(token: int) -> torch.Tensor:
            calls.append(token)
            return uniform

        gen = decode_loop(uniform, step, SamplingParams(temperature=1.0, seed=5, max_tokens=12), [])
        assert gen.finish_reason == "length"
        assert calls == gen.token_ids[:-1]
        return gen.token_ids

    first = run()
    assert first == run()
    assert len(first) == 12
    assert len(set(first)) > 1
