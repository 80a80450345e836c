"""What one request measured: the record every driver (HTTP or in-process transformers) produces."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class RequestResult:
    """What one request measured. Times in seconds; `started_s` is `time.perf_counter()` at send."""

    index: int
    ok: bool
    started_s: float
    ttft_s: float | None = None  # send -> first chunk carrying a token
    e2e_s: float | None = None  # send -> end of the stream
    itl_s: tuple[float, ...] = ()  # gaps between successive token-carrying chunks
    output_tokens: int = 0
    prompt_tokens: int | None = None
    status: int | None = None  # HTTP status (None: no response, e.g. connection refused)
    error: str | None = None
    output_text: str = ""  # what the request generated (greedy in every built-in load)
    output_ids: tuple[int, ...] | None = None  # its token ids; None where the server sends none

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first; None when there is no second token."""
        if not self.ok or self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    def to_dict(self) -> dict:
        return {**asdict(self), "itl_s": list(self.itl_s), "tpot_s": self.tpot_s,
                "output_ids": None if self.output_ids is None else list(self.output_ids)}
