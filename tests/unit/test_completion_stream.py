"""stream_completion: token events from a fake orchestrator to deltas, stop strings, finish reason and usage."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from epd.engine.sampling import SamplingParams
from epd.tiny.tokenizer import build_tokenizer
from router.completion import Delta, Final, stream_completion
from router.orchestrator import Job, TokenEvent, UpstreamError

SPECIALS = ["<|eos|>", "<|pad|>", "<|image|>"]
JOB = Job(request_id="r1", prompt_ids=[1, 2, 3], images=[], sampling=SamplingParams(), timeout_s=5.0)


@pytest.fixture(scope="module")
def tokenizer():
    # The same real byte-level BPE the tiny checkpoints use (tests/unit/test_detokenizer.py builds it per family);
    # trained here in a fraction of a second, no weights anywhere.
    return build_tokenizer(512, SPECIALS, 0, eos_token="<|eos|>", pad_token="<|pad|>", bos_token=None,
                           chat_template="{{ messages }}")


class FakeOrchestrator:
    """`run(job)` yields the given events; records what it saw and whether its generator was closed."""

    def __init__(self, events: list[TokenEvent]) -> None:
        self.events = events
        self.jobs: list[Job] = []
        self.yielded = 0
        self.closed = False

    async def run(self, job: Job):
        self.jobs.append(job)
        try:
            for event in self.events:
                self.yielded += 1
                yield event
        finally:
            self.closed = True


def collect(orchestrator: FakeOrchestrator, tokenizer, stops: tuple[str, ...] = ()) -> tuple[list[Delta], Final]:
    async def main():
        return [item async for item in stream_completion(orchestrator, tokenizer, JOB, stops)]

    items = asyncio.run(main())
    assert items and isinstance(items[-1], Final)
    assert all(isinstance(item, Delta) for item in items[:-1])
    return items[:-1], items[-1]


def events_for(ids: list[int], sizes: list[int], finish: str | None, prompt_tokens: int = 7) -> list[TokenEvent]:
    """`ids` split into events of `sizes`; prompt_tokens on the first, finish on the last."""
    assert sum(sizes) == len(ids)
    events, start = [], 0
    for n, size in enumerate(sizes):
        last = n == len(sizes) - 1
        events.append(TokenEvent(ids[start:start + size], finish if last else None,
                                 prompt_tokens=prompt_tokens if n == 0 else 0))
        start += size
    return events


def text_of(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas)


def test_deltas_concatenate_to_the_full_decode(tokenizer):
    ids = tokenizer.encode("hello world. the cat 東京 sat 🚀!", add_special_tokens=False)
    fake = FakeOrchestrator(events_for(ids, [1] * len(ids), "length"))
    deltas, final = collect(fake, tokenizer)
    assert text_of(deltas) == tokenizer.decode(ids, skip_special_tokens=True) == "hello world. the cat 東京 sat 🚀!"
    assert [i for d in deltas for i in d.token_ids] == ids
    assert all("\ufffd" not in d.text for d in deltas)
    assert fake.jobs == [JOB]


def test_uneven_event_sizes_give_the_same_text(tokenizer):
    ids = tokenizer.encode("naïve 東京 the house", add_special_tokens=False)
    sizes = [2, 1, 4, len(ids) - 7]
    deltas, _ = collect(FakeOrchestrator(events_for(ids, sizes, "stop")), tokenizer)
    assert text_of(deltas) == "naïve 東京 the house"
    assert [d.token_ids for d in deltas] == [ids[0:2], ids[2:3], ids[3:7], ids[7:]]


def test_special_tokens_are_skipped_but_their_ids_are_kept(tokenizer):
    eos = tokenizer.convert_tokens_to_ids("<|eos|>")
    ids = tokenizer.encode("the cat", add_special_tokens=False) + [eos]
    deltas, final = collect(FakeOrchestrator(events_for(ids, [len(ids) - 1, 1], "stop")), tokenizer)
    assert text_of(deltas) == "the cat"
    assert deltas[-1] == Delta("", [eos])  # an event with ids but no text is still a delta
    assert final == Final("stop", 7, len(ids))


def test_final_counts_and_finish_reason(tokenizer):
    ids = tokenizer.encode("the dog", add_special_tokens=False)
    events = [TokenEvent(ids[:1], None, prompt_tokens=11), TokenEvent(ids[1:], None, prompt_tokens=99),
              TokenEvent([], "length")]
    _, final = collect(FakeOrchestrator(events), tokenizer)
    assert final == Final(finish_reason="length", prompt_tokens=11, completion_tokens=len(ids))


def test_finish_on_the_first_event_ends_there(tokenizer):
    ids = tokenizer.encode("a", add_special_tokens=False)
    fake = FakeOrchestrator([TokenEvent(ids, "length", prompt_tokens=4), TokenEvent([9, 9], None)])
    deltas, final = collect(fake, tokenizer)
    assert deltas == [Delta("a", ids)]
    assert final == Final("length", 4, len(ids))
    assert (fake.yielded, fake.closed) == (1, True)


def test_stop_string_ends_the_stream_without_the_stop_text(tokenizer):
    ids = tokenizer.encode("the cat\n\nUser: more text here", add_special_tokens=False)
    fake = FakeOrchestrator(events_for(ids, [1] * len(ids), "length"))
    deltas, final = collect(fake, tokenizer, stops=("\n\nUser:",))
    assert text_of(deltas) == "the cat"
    assert final.finish_reason == "stop"
    assert fake.closed is True  # the orchestrator's generator got closed: its finally ran
    assert fake.yielded < len(ids)  # nothing was pulled after the stop
    assert final.completion_tokens == sum(len(d.token_ids) for d in deltas) == fake.yielded
    assert final.prompt_tokens == 7


def test_stop_string_inside_one_event(tokenizer):
    ids = tokenizer.encode("one two STOP three", add_special_tokens=False)
    fake = FakeOrchestrator([TokenEvent(ids, None, prompt_tokens=3), TokenEvent([5], "length")])
    deltas, final = collect(fake, tokenizer, stops=("STOP",))
    assert deltas == [Delta("one two ", ids)]
    assert final == Final("stop", 3, len(ids))
    assert (fake.yielded, fake.closed) == (1, True)


def test_held_partial_stop_is_released_at_the_end(tokenizer):
    ids = tokenizer.encode("the cat STO", add_special_tokens=False)
    deltas, final = collect(FakeOrchestrator(events_for(ids, [1] * len(ids), "length")), tokenizer,
                            stops=("STOP",))
    assert text_of(deltas) == "the cat STO"  # held back as a possible "STOP", then flushed at the finish
    assert final.finish_reason == "length"


def test_cancelled_by_the_worker_is_an_error_not_a_stop(tokenizer):
    ids = tokenizer.encode("the sky", add_special_tokens=False)
    with pytest.raises(UpstreamError) as caught:
        collect(FakeOrchestrator(events_for(ids, [1, len(ids) - 1], "cancelled")), tokenizer)
    assert caught.value.code == grpc.StatusCode.CANCELLED


def test_stream_ending_without_a_finish_reason_is_an_error(tokenizer):
    ids = tokenizer.encode("the cat STO", add_special_tokens=False)
    with pytest.raises(UpstreamError) as caught:
        collect(FakeOrchestrator(events_for(ids, [1] * len(ids), None)), tokenizer, stops=("STOP",))
    assert caught.value.code == grpc.StatusCode.INTERNAL and "finish reason" in caught.value.message


def test_empty_stream_is_an_error(tokenizer):
    with pytest.raises(UpstreamError):
        collect(FakeOrchestrator([]), tokenizer)


def test_an_orchestrator_error_propagates_and_closes_the_generator(tokenizer):
    class Failing(FakeOrchestrator):
        async def run(self, job):
            try:
                yield TokenEvent([65], None, prompt_tokens=1)
                raise RuntimeError("decode worker gone")
            finally:
                self.closed = True

    fake = Failing([])

    async def main():
        got = []
        with pytest.raises(RuntimeError, match="decode worker gone"):
            async for item in stream_completion(fake, tokenizer, JOB, ()):
                got.append(item)
        return got

    got = asyncio.run(main())
    assert got == [Delta(tokenizer.decode([65]), [65])]
    assert fake.closed is True


def test_closing_the_completion_early_closes_the_orchestrator(tokenizer):
    ids = tokenizer.encode("the cat sat on the table", add_special_tokens=False)
    fake = FakeOrchestrator(events_for(ids, [1] * len(ids), "length"))

    async def main():
        stream = stream_completion(fake, tokenizer, JOB, ())
        first = await anext(stream)
        await stream.aclose()  # the client went away
        return first

    first = asyncio.run(main())
    assert first == Delta(tokenizer.decode(ids[:1]), ids[:1])
    assert fake.closed is True
    assert fake.yielded == 1


def test_only_events_of_many_tokens_are_detokenized_on_the_pool(tokenizer):
    """A one-token event costs microseconds to detokenize and far more to hand to a thread and back:
    it stays on the event loop; an event past INLINE_TOKENS goes to the pool. The text is the same."""
    from router.completion import INLINE_TOKENS
    from router.offload import Offload

    class CountingOffload(Offload):
        def __init__(self) -> None:
            super().__init__(1)
            self.sizes: list[int] = []

        async def run(self, fn, *args, **kwargs):
            self.sizes.append(len(args[2]))  # _advance(detok, matcher, token_ids, finish_reason)
            return await super().run(fn, *args, **kwargs)

    ids = tokenizer("one two three four five six seven eight nine ten eleven twelve")["input_ids"]
    many = INLINE_TOKENS + 1
    ids = (ids * (many // len(ids) + 2))[:many + 3]
    events = events_for(ids, [1, 1, many, 1], "length")
    offload = CountingOffload()

    async def main():
        return [item async for item in stream_completion(FakeOrchestrator(events), tokenizer, JOB, (), offload)]

    try:
        items = asyncio.run(main())
    finally:
        offload.close()
    assert offload.sizes == [many]
    deltas, _ = collect(FakeOrchestrator(events), tokenizer)  # no pool at all
    assert "".join(d.text for d in items[:-1]) == "".join(d.text for d in deltas) == tokenizer.decode(ids)
