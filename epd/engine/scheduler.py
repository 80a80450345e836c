"""Which sequences run in the next forward, and how many of their tokens: pure Python, no torch.

Each step has a token budget (`max_batched_tokens`) and a sequence cap (`max_running`). Running
sequences are served first — under the `decode_first` policy decodes before continuing prefills,
so streams keep their pace while long prompts arrive; under `fcfs` strictly by arrival — then
waiting ones are admitted while budget and blocks last. A prompt longer than `max_prefill_chunk`
(or than what is left of the budget) is prefilled over several steps.

When a running sequence needs a block and none is free, the most recently arrived running sequence
that can be rebuilt is preempted: its blocks are freed and it goes back to the front of the queue,
to be prefilled again (prompt + what it generated; the prefix cache often makes that cheap).
Non-recomputable sequences (imported KV) hold their whole lifetime's blocks and are never victims.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from epd.engine.block_manager import BlockManager
from epd.engine.sequence import Finish, Sequence, Status

POLICIES = ("decode_first", "fcfs")


@dataclass(frozen=True)
class SchedulerConfig:
    max_running: int = 64  # sequences holding blocks at once
    max_batched_tokens: int = 2048  # tokens in one forward
    max_prefill_chunk: int = 512  # most prompt tokens one sequence computes per step
    max_waiting: int = 256  # queued sequences; beyond this `add` refuses
    policy: str = "decode_first"
    admission_reserve_blocks: int = 0  # free blocks kept back at admission, so running sequences can grow

    def __post_init__(self) -> None:
        for name in ("max_running", "max_batched_tokens", "max_prefill_chunk", "max_waiting"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.admission_reserve_blocks < 0:
            raise ValueError(f"admission_reserve_blocks must be >= 0, got {self.admission_reserve_blocks}")
        if self.policy not in POLICIES:
            raise ValueError(f"scheduler policy must be one of {POLICIES}, got {self.policy!r}")


@dataclass(frozen=True)
class Scheduled:
    """`num_new_tokens` tokens of `seq`, from index `start`, go through this step's forward."""

    seq: Sequence
    start: int
    num_new_tokens: int

    @property
    def samples(self) -> bool:
        """Whether this step reaches the sequence's last token, so its logits give the next one."""
        return self.start + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[Scheduled] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def largest_chunk(self) -> int:
        """The most tokens one sequence computes in this step: 1 when it only decodes, 0 when empty."""
        return max((s.num_new_tokens for s in self.scheduled), default=0)

    @property
    def kind(self) -> str:
        """"prompt" when a sequence computes prompt tokens in this step (a chunk, or a preempted
        sequence's recompute), else "decode": how steps are told apart in `epd_step_seconds`."""
        return "prompt" if any(s.start < s.seq.num_prompt_tokens for s in self.scheduled) else "decode"


class QueueFull(RuntimeError):
    """The waiting queue is at `max_waiting`."""


class Scheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockManager) -> None:
        self.config = config
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order
        self.num_preemptions = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        """Queue a sequence (QueueFull beyond `max_waiting`)."""
        if len(self.waiting) >= self.config.max_waiting:
            raise QueueFull(f"{len(self.waiting)} sequences already wait; the limit is {self.config.max_waiting}")
        if self.blocks.blocks_for(seq.max_total_tokens if not seq.recomputable else seq.num_tokens) \
                > self.blocks.num_blocks - 1:
            raise ValueError(f"{seq.request_id}: {seq.num_tokens} tokens can never fit in "
                             f"{self.blocks.num_blocks - 1} KV blocks of {self.blocks.block_size}")
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def schedule_would_admit(self) -> bool:
        """Whether the head of the queue could get its blocks now."""
        return bool(self.waiting) and self.blocks.can_allocate(self.waiting[0])

    def admit_now(self, seq: Sequence) -> bool:
        """Give blocks to a sequence whose KV is already computed (imported) and run it, if blocks allow."""
        if len(self.running) >= self.config.max_running or not self.blocks.can_allocate(seq):
            return False
        self.blocks.allocate(seq)
        seq.status = Status.RUNNING
        self.running.append(seq)
        return True

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_batched_tokens
        scheduled_ids: set[int] = set()
        for seq in self._running_order():
            if seq.status is not Status.RUNNING:  # preempted earlier in this loop
                continue
            wanted = min(seq.num_pending, self.config.max_prefill_chunk, budget)
            if wanted < 1:
                continue
            if not self._make_room(seq, wanted, scheduled_ids, out):
                continue  # seq itself was preempted
            self.blocks.append_slots(seq, wanted)
            out.scheduled.append(Scheduled(seq, seq.num_computed_tokens, wanted))
            scheduled_ids.add(id(seq))
            budget -= wanted
        if not out.preempted:  # admitting right after preempting would only thrash
            budget = self._admit(out, budget)
        return out

    def update(self, out: SchedulerOutput, sampled: dict[int, int]) -> list[tuple[Sequence, int, Finish | None]]:
        """Apply a step's results: advance computed tokens, append sampled tokens (keyed by id(seq)),
        mark finished sequences (their blocks stay until `finish`). Returns (seq, token, finish)
        for every sequence that got a token."""
        events = []
        for item in out.scheduled:
            seq = item.seq
            if seq.status is not Status.RUNNING:
                continue  # aborted while the forward ran
            seq.num_computed_tokens = item.start + item.num_new_tokens
            self.blocks.register_full_blocks(seq)
            if id(seq) in sampled:
                token = sampled[id(seq)]
                finish = seq.append(token)
                events.append((seq, token, finish))
                if finish is not None:
                    seq.status, seq.finish = Status.FINISHED, finish
        return events

    def finish(self, seq: Sequence, reason: Finish | None = None) -> None:
        """Take a sequence out (finished or aborted) and free its blocks."""
        if seq.status is Status.WAITING:
            self.waiting.remove(seq)
        elif seq in self.running:
            self.running.remove(seq)
        self.blocks.free(seq)
        seq.status = Status.FINISHED
        if reason is not None:
            seq.finish = reason

    # --- internals ------------------------------------------------------------------------------

    def _running_order(self) -> list[Sequence]:
        if self.config.policy == "fcfs":
            return sorted(self.running, key=lambda s: s.arrival)
        return sorted(self.running, key=lambda s: (s.is_prefilling, s.arrival))

    def _make_room(self, seq: Sequence, wanted: int, scheduled_ids: set[int], out: SchedulerOutput) -> bool:
        """Preempt until `seq` can take `wanted` more tokens; False if `seq` itself had to go."""
        while not self.blocks.can_append(seq, wanted):
            victim = self._victim(exclude=scheduled_ids)
            if victim is None or victim is seq:
                self._preempt(seq, out)
                return False
            self._preempt(victim, out)
        return True

    def _victim(self, exclude: set[int]) -> Sequence | None:
        candidates = [s for s in self.running if s.recomputable and id(s) not in exclude]
        return max(candidates, key=lambda s: s.arrival, default=None)

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        if not seq.recomputable:
            raise RuntimeError(f"{seq.request_id} holds imported KV and cannot be preempted")
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        self.num_preemptions += 1

    def _admit(self, out: SchedulerOutput, budget: int) -> int:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_running:
            seq = self.waiting[0]
            if not self.blocks.can_allocate(seq, reserve=self.config.admission_reserve_blocks):
                break  # first come, first served: nobody overtakes the head of the queue
            self.waiting.popleft()
            self.blocks.allocate(seq)
            seq.status = Status.RUNNING
            self.running.append(seq)
            wanted = min(seq.num_pending, self.config.max_prefill_chunk, budget)
            out.scheduled.append(Scheduled(seq, seq.num_computed_tokens, wanted))
            budget -= wanted
        return budget
