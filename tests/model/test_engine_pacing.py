"""Decode pacing through the real engine loop: while other processes are said to keep the cores busy,
decode steps start at most once per interval, and the tokens stay those of `generate`."""

from __future__ import annotations

import time

from prometheus_client import REGISTRY

from epd.engine.loop import EngineLoop
from epd.engine.pacing import DecodePacing
from tests.model.test_engine_batching import NEW_TOKENS, _pipeline, _reference, _sequence

INTERVAL_S = 0.05


class _Busy:
    """A HostLoad whose other processes keep `others` cores busy."""

    def __init__(self, others: float) -> None:
        self.others = others

    def update(self, period_s: float | None = None) -> float:
        return self.others


def _run_in_loop(pipe, indices: list[int], others: float) -> tuple[dict[int, list[int]], list[float]]:
    """Run the requests through an EngineLoop with pacing; their tokens and the times the first one's arrived."""
    loop = EngineLoop(pipe.engine, pacing=DecodePacing(INTERVAL_S), host_load=_Busy(others))
    loop.start()
    try:
        streams = {i: loop.submit(_sequence(pipe, i)) for i in indices}
        tokens: dict[int, list[int]] = {i: [] for i in indices}
        arrivals: list[float] = []
        for i, stream in streams.items():
            while True:
                out = stream.get(timeout_s=60)
                if out.token >= 0:
                    tokens[i].append(out.token)
                    if i == indices[0]:
                        arrivals.append(time.monotonic())
                if out.finish is not None:
                    break
    finally:
        loop.close()
    return tokens, arrivals


def test_paced_decode_steps_wait_their_interval_and_give_the_same_tokens(tiny_dirs):
    model = tiny_dirs["kimi_k25"]
    pipe = _pipeline(model, num_blocks=256, block_size=4)
    paced = REGISTRY.get_sample_value("epd_decode_paced_seconds_total", {"role": "in_process"}) or 0.0
    tokens, arrivals = _run_in_loop(pipe, [1, 3], others=2.0)
    for index in (1, 3):
        assert tokens[index] == list(_reference(model, index)), f"request {index} differs"
    decoded = arrivals[1:]  # the first token comes from the prefill step
    gaps = sorted(b - a for a, b in zip(decoded, decoded[1:], strict=False))
    assert len(gaps) >= NEW_TOKENS - 3
    assert gaps[len(gaps) // 2] >= INTERVAL_S * 0.9, f"median gap {gaps[len(gaps) // 2]:.3f} s: steps not paced"
    waited = REGISTRY.get_sample_value("epd_decode_paced_seconds_total", {"role": "in_process"}) - paced
    assert waited > INTERVAL_S * (NEW_TOKENS // 2) * 0.5


def test_idle_cores_never_pace(tiny_dirs):
    pipe = _pipeline(tiny_dirs["kimi_k25"], num_blocks=256, block_size=4)
    paced = REGISTRY.get_sample_value("epd_decode_paced_seconds_total", {"role": "in_process"}) or 0.0
    tokens, _ = _run_in_loop(pipe, [1], others=0.0)
    assert tokens[1] == list(_reference(tiny_dirs["kimi_k25"], 1))
    assert (REGISTRY.get_sample_value("epd_decode_paced_seconds_total", {"role": "in_process"}) or 0.0) == paced
