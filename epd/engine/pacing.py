"""Decode steps paced while other processes keep this worker's CPUs busy (CPU hosts only).

Most of a decode step's cost is per step, not per sequence: every layer's dense weights and most
of its experts are read once per step (small Kimi checkpoint, 2 CPUs: 19.5 ms at batch 1, 59 ms
at batch 16). A decode worker that steps as soon as it can, while the encoder and prefill workers
on the same cores are busy with the next requests' images and prompts, runs many tiny batches
and takes a core they need: under 16 concurrent image requests it spent 0.68 CPU-s per request
(average batch 2.7), more than the prefill worker's 0.38. Waiting between its steps while the
cores are shared lets the batch grow (batch ≈ arrivals/s × tokens per request × interval) and
hands the cores to the front end, which is what every queued request waits for: 16 image
requests finish sooner, and inter-token latency under that load becomes about the interval. That
trade is the user's to make, so it is off unless `--decode-step-interval-ms` asks for it.

Nothing is paused on CPUs the worker has to itself (`--cpu-affinity auto`), on a GPU, while this
engine has prompts to prefill, or once the batch is full. Only decode workers pace: a prefill or
colocated engine is itself the front end the others wait for.

During a wait (`EngineLoop._pace`) new sequences are admitted at once, so their first token goes
out, but they do not end it: under a burst every arrival would otherwise start a step of its own,
and the steps stayed as small and as many as unpaced ones. The wait ends early when the batch is
full, when a sequence needs a prompt step, and when the other processes go idle (the load is
looked at again every 50 ms), since waiting on then only leaves the cores idle.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodePacing:
    interval_s: float  # a decode step starts at most once per interval while the CPUs are shared; 0: off
    busy_threshold: float = 0.5  # cores of this worker's CPUs that other processes keep busy: "shared"

    def __post_init__(self) -> None:
        if self.interval_s < 0:
            raise ValueError(f"the decode step interval must be >= 0, got {self.interval_s * 1000:g} ms")

    def pause_s(self, step_s: float, decode_only: bool, batch: int, max_batch: int, others_busy: float) -> float:
        """Seconds to wait after a step that took `step_s`, `batch` sequences running after it (pure)."""
        if self.interval_s <= 0 or not decode_only or not 0 < batch < max_batch or others_busy <= self.busy_threshold:
            return 0.0
        return max(self.interval_s - step_s, 0.0)
