"""Scheduler on exact numbers, no model: budgets, chunking, admission, preemption order, policies."""

from __future__ import annotations

import pytest

from epd.engine.block_manager import BlockManager
from epd.engine.scheduler import QueueFull, Scheduler, SchedulerConfig
from epd.engine.sequence import Finish, Status
from tests.unit.engine.helpers import check_invariants, seq


def make(num_blocks=64, block_size=4, **config) -> Scheduler:
    return Scheduler(SchedulerConfig(**config), BlockManager(num_blocks, block_size, enable_prefix_cache=False))


def plan(out) -> list[tuple[str, int, int]]:
    return [(s.seq.request_id, s.start, s.num_new_tokens) for s in out.scheduled]


def run_step(sched: Scheduler, token: int = 7):
    """Schedule, then sample `token` for every sequence that reached its last token."""
    out = sched.schedule()
    sampled = {id(s.seq): token for s in out.scheduled if s.samples}
    events = sched.update(out, sampled)
    for s, _, finish in events:
        if finish is not None:
            sched.finish(s)
    return out, events


def test_a_short_prompt_is_prefilled_in_one_step_then_decoded_one_token_a_step():
    sched = make()
    a = seq("a", 10, max_tokens=3)
    sched.add(a)
    out, events = run_step(sched)
    assert plan(out) == [("a", 0, 10)]
    assert [(e[0].request_id, e[1], e[2]) for e in events] == [("a", 7, None)]
    out, _ = run_step(sched)
    assert plan(out) == [("a", 10, 1)]
    out, events = run_step(sched)
    assert plan(out) == [("a", 11, 1)]
    assert events[0][2] is Finish.LENGTH and a.num_generated == 3
    assert not sched.has_work and sched.blocks.num_used_blocks == 0


def test_long_prompts_are_chunked_by_max_prefill_chunk():
    sched = make(max_prefill_chunk=4, max_batched_tokens=100)
    a = seq("a", 10)
    sched.add(a)
    starts = []
    for _ in range(3):
        out, events = run_step(sched)
        starts += plan(out)
        if len(starts) < 3:
            assert events == []  # no token until the whole prompt is in
    assert starts == [("a", 0, 4), ("a", 4, 4), ("a", 8, 2)]
    assert a.num_generated == 1


def test_the_token_budget_splits_prompts_across_steps():
    sched = make(max_batched_tokens=12, max_prefill_chunk=100)
    for name in "abc":
        sched.add(seq(name, 8))
    out, _ = run_step(sched)
    assert plan(out) == [("a", 0, 8), ("b", 0, 4)]
    assert (out.num_tokens, out.largest_chunk, out.kind) == (12, 8, "prompt")
    out, _ = run_step(sched)
    # decode-first: a decodes, b continues its prompt, c starts with what is left
    assert plan(out) == [("a", 8, 1), ("b", 4, 4), ("c", 0, 7)]
    assert (out.num_tokens, out.largest_chunk, out.kind) == (12, 7, "prompt")
    out, _ = run_step(sched)
    assert plan(out) == [("a", 9, 1), ("b", 8, 1), ("c", 7, 1)]
    # one token each, but c's is its prompt's last (the budget left it one short): a prompt step
    assert (out.num_tokens, out.largest_chunk, out.kind) == (3, 1, "prompt")
    out, _ = run_step(sched)
    assert (out.num_tokens, out.largest_chunk, out.kind) == (3, 1, "decode")


def test_a_one_token_prompt_chunk_makes_a_prompt_step_not_a_decode():
    sched = make(max_prefill_chunk=4, max_batched_tokens=100)
    sched.add(seq("a", 9))
    kinds = []
    for _ in range(4):
        out, _ = run_step(sched)
        kinds.append((plan(out)[0][2], out.largest_chunk, out.kind))
    # the last chunk is one token, as a decode is, but it is the prompt's: kind says so
    assert kinds == [(4, 4, "prompt"), (4, 4, "prompt"), (1, 1, "prompt"), (1, 1, "decode")]


def test_decode_first_serves_decodes_before_a_continuing_prefill():
    sched = make(max_batched_tokens=5, max_prefill_chunk=4)
    a, b = seq("a", 20), seq("b", 2)
    sched.add(a)
    run_step(sched)  # a: 0..4
    sched.add(b)
    out, _ = run_step(sched)
    assert plan(out) == [("a", 4, 4), ("b", 0, 1)]
    out, _ = run_step(sched)
    assert plan(out) == [("b", 1, 1), ("a", 8, 4)]  # one token left of b's prompt: served like a decode
    out, _ = run_step(sched)
    assert plan(out) == [("b", 2, 1), ("a", 12, 4)]


def test_fcfs_serves_by_arrival_whatever_the_phase():
    sched = make(max_batched_tokens=5, max_prefill_chunk=4, policy="fcfs")
    a, b = seq("a", 20), seq("b", 2)
    sched.add(a)
    run_step(sched)
    sched.add(b)
    run_step(sched)
    run_step(sched)
    out, _ = run_step(sched)
    assert plan(out) == [("a", 12, 4), ("b", 2, 1)]


def test_max_running_caps_admission():
    sched = make(max_running=2)
    for name in "abc":
        sched.add(seq(name, 3))
    out, _ = run_step(sched)
    assert plan(out) == [("a", 0, 3), ("b", 0, 3)]
    assert [s.request_id for s in sched.waiting] == ["c"]


def test_admission_waits_for_blocks_and_never_skips_the_head():
    sched = make(num_blocks=6, block_size=4)  # 5 usable blocks
    big, small = seq("big", 17, max_tokens=1), seq("small", 2)
    sched.add(seq("first", 12, max_tokens=2))
    sched.add(big)
    sched.add(small)
    out, _ = run_step(sched)
    assert plan(out) == [("first", 0, 12)]  # big needs 5 blocks, 2 are free; small must not overtake
    assert sched.blocks.num_free_blocks == 2


def test_the_queue_is_bounded():
    sched = make(max_waiting=2)
    sched.add(seq("a", 3))
    sched.add(seq("b", 3))
    with pytest.raises(QueueFull):
        sched.add(seq("c", 3))


def test_a_prompt_larger_than_the_pool_is_refused_at_once():
    sched = make(num_blocks=3, block_size=4)
    with pytest.raises(ValueError, match="can never fit"):
        sched.add(seq("a", 9))


def test_preemption_takes_the_latest_arrival_and_requeues_it_first():
    sched = make(num_blocks=5, block_size=4)  # 4 usable
    a, b = seq("a", 4, max_tokens=20), seq("b", 4, max_tokens=20)
    sched.add(a)
    sched.add(b)
    run_step(sched)  # both prefilled: 2 blocks used, each seq now has 5 tokens
    run_step(sched)  # token 5 of each needs a block: 4 used
    assert sched.blocks.num_free_blocks == 0
    for _ in range(3):
        run_step(sched)
    out, _ = run_step(sched)  # token 8: a needs a third block, none free -> b (latest) goes
    assert [s.request_id for s in out.preempted] == ["b"]
    assert plan(out) == [("a", 8, 1)]
    assert b.status is Status.WAITING and b.num_computed_tokens == 0 and sched.waiting[0] is b
    assert sched.num_preemptions == 1
    assert b.num_generated == 5  # what it generated stays; it is recomputed on resume
    check_invariants(sched.blocks, [a])


def test_a_sequence_preempts_itself_when_it_is_the_latest():
    sched = make(num_blocks=4, block_size=4)  # 3 usable
    a, b = seq("a", 4, max_tokens=20), seq("b", 4, max_tokens=20)
    sched.add(a)
    sched.add(b)
    run_step(sched)
    out, _ = run_step(sched)  # a takes the last block for its token 5; b needs one too and is the latest
    assert [s.request_id for s in out.preempted] == ["b"]
    assert plan(out) == [("a", 4, 1)]


def test_no_admission_in_a_step_that_preempted():
    sched = make(num_blocks=4, block_size=4)
    a, b = seq("a", 4, max_tokens=20), seq("b", 4, max_tokens=20)
    sched.add(a)
    sched.add(b)
    run_step(sched)
    out, _ = run_step(sched)
    assert out.preempted == [b] and all(s.seq is not b for s in out.scheduled)
    out, _ = run_step(sched)  # still no block for b: it waits at the head of the queue
    assert plan(out) == [("a", 5, 1)] and sched.waiting[0] is b


def test_imported_sequences_are_never_victims():
    sched = make(num_blocks=6, block_size=4)  # 5 usable
    imported = seq("imported", 4, max_tokens=8, recomputable=False, cacheable=False)
    imported.num_computed_tokens = 4
    imported.token_ids.append(9)
    assert sched.admit_now(imported)  # 3 blocks for 12 tokens
    late = seq("late", 4, max_tokens=20)
    sched.add(late)
    for _ in range(6):
        out, _ = run_step(sched)
        assert imported not in out.preempted
    assert sched.num_preemptions >= 1 and imported.status is Status.RUNNING


def test_admit_now_refuses_when_blocks_are_short():
    sched = make(num_blocks=4, block_size=4)
    imported = seq("imported", 8, max_tokens=8, recomputable=False, cacheable=False)
    imported.num_computed_tokens = 8
    assert not sched.admit_now(imported)  # needs 4 blocks, 3 exist
    assert sched.blocks.num_used_blocks == 0 and not sched.running


def test_handoff_finishes_after_the_first_token_and_keeps_blocks_until_finish():
    sched = make()
    a = seq("a", 6, max_tokens=10, handoff=True)
    sched.add(a)
    out = sched.schedule()
    [(s, token, finish)] = sched.update(out, {id(a): 3})
    assert finish is Finish.HANDOFF and a.num_generated == 1
    assert len(a.block_table) == 2  # still held: the caller exports them first
    sched.finish(a)
    assert sched.blocks.num_used_blocks == 0 and not sched.running


def test_a_stop_token_ends_with_stop():
    sched = make()
    a = seq("a", 3, max_tokens=10, stop=frozenset({7}))
    sched.add(a)
    _, events = run_step(sched, token=7)
    assert events[0][2] is Finish.STOP


def test_aborting_a_waiting_or_running_sequence_frees_it():
    sched = make(max_running=1)
    a, b = seq("a", 5), seq("b", 5)
    sched.add(a)
    sched.add(b)
    run_step(sched)
    sched.finish(a, Finish.CANCELLED)
    sched.finish(b, Finish.CANCELLED)
    assert a.finish is Finish.CANCELLED and b.finish is Finish.CANCELLED
    assert not sched.has_work and sched.blocks.num_used_blocks == 0


def test_an_abort_during_the_forward_skips_the_update():
    sched = make()
    a = seq("a", 5)
    sched.add(a)
    out = sched.schedule()
    sched.finish(a, Finish.CANCELLED)
    assert sched.update(out, {id(a): 1}) == []
    assert a.num_generated == 0


@pytest.mark.parametrize("bad", [dict(max_running=0), dict(max_batched_tokens=0), dict(policy="lifo"),
                                 dict(admission_reserve_blocks=-1)])
def test_config_is_validated(bad):
    with pytest.raises(ValueError):
        SchedulerConfig(**bad)
