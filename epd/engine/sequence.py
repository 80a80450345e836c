"""One request's state inside the engine: its tokens, how many have KV, its blocks, how it stops.

Pure Python (no torch): the scheduler and the block manager work on these and are tested without a
model. What only the model runner needs (image tensors, position plan, a sampler) rides along in
`inputs`, opaque to everything else.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field

from epd.engine.params import SamplingParams

_arrivals = itertools.count()


class Status(enum.Enum):
    WAITING = "waiting"  # no blocks; will be (re)prefilled from token 0, or from a prefix-cache hit
    RUNNING = "running"  # holds blocks; scheduled every step until it finishes
    FINISHED = "finished"


class Finish(enum.Enum):
    STOP = "stop"  # an EOS or stop token id
    LENGTH = "length"  # max_tokens or the model's context
    CANCELLED = "cancelled"  # aborted (client gone, deadline, shutdown)
    HANDOFF = "handoff"  # prefill role: prompt done and first token sampled; the KV goes to a decode worker


@dataclass(frozen=True)
class ImageSpan:
    """Where one image's tokens sit in the prompt, and what they are (for content hashes)."""

    start: int
    num_tokens: int
    digest: str


@dataclass(eq=False)
class Sequence:
    """A request in the engine. `token_ids` is the prompt followed by every generated token.

    The token at index `num_computed_tokens` is the next one whose KV the model must compute; a
    step that computes up to the last token samples a new one. Imported sequences (decode workers)
    start with the prompt's KV already present: `num_computed_tokens == num_prompt_tokens`.
    """

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    stop_token_ids: frozenset[int] = frozenset()
    images: tuple[ImageSpan, ...] = ()
    max_model_len: int = 1 << 30
    handoff: bool = False  # finish with HANDOFF once the first token is sampled (prefill role)
    recomputable: bool = True  # False: KV came from elsewhere, so preemption cannot rebuild it
    cacheable: bool = True  # its full blocks may be shared through the prefix cache
    inputs: object = None  # the model runner's per-sequence data
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # content hash of each full block, in order
    status: Status = Status.WAITING
    finish: Finish | None = None
    arrival: int = field(default_factory=lambda: next(_arrivals))

    def __post_init__(self) -> None:
        if not 0 < self.num_prompt_tokens <= len(self.token_ids):
            raise ValueError(f"{self.request_id}: {self.num_prompt_tokens} prompt tokens of {len(self.token_ids)}")

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated(self) -> int:
        """Tokens after the prompt, the first (sampled by prefill) included."""
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_pending(self) -> int:
        """Tokens whose KV is still to compute before the next sample."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        return self.num_pending > 1

    @property
    def max_total_tokens(self) -> int:
        """The most tokens this sequence can ever hold: prompt + max_tokens, capped by the context."""
        return min(self.num_prompt_tokens + self.params.max_tokens, self.max_model_len)

    def content_key(self, index: int) -> int | tuple[str, int]:
        """What token `index` is, for prefix hashing: its id, or (image digest, offset) for an image token."""
        for image in self.images:
            if image.start <= index < image.start + image.num_tokens:
                return image.digest, index - image.start
        return self.token_ids[index]

    def block_content(self, block_index: int, block_size: int) -> tuple:
        start = block_index * block_size
        return tuple(self.content_key(i) for i in range(start, start + block_size))

    def append(self, token: int) -> Finish | None:
        """Add a sampled token; returns why the sequence ends now, if it does."""
        self.token_ids.append(token)
        if token in self.stop_token_ids:
            return Finish.STOP
        if self.num_generated >= self.params.max_tokens or self.num_tokens >= self.max_model_len:
            return Finish.LENGTH
        return Finish.HANDOFF if self.handoff else None


def stop_ids(params: SamplingParams, eos_token_ids: Iterable[int], extra: Iterable[int] = ()) -> frozenset[int]:
    """Token ids that end a sequence: the model's EOS ids (unless ignore_eos) plus the request's own."""
    return frozenset(extra) | (frozenset() if params.ignore_eos else frozenset(eos_token_ids))
