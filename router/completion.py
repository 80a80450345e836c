"""From token events to what clients see: incremental text, stop strings, finish reason, usage.

Both front ends (HTTP/SSE and gRPC) consume `stream_completion`, so they cannot drift apart.
Latency metrics are observed here, at the last point before the client.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc

from epd import metrics
from router.detokenizer import IncrementalDetokenizer, StopMatcher
from router.offload import Offload
from router.orchestrator import Job, Orchestrator, UpstreamError, aclose_quietly


@dataclass(frozen=True)
class Delta:
    text: str
    token_ids: list[int]


@dataclass(frozen=True)
class Final:
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    completion_tokens: int


# An event of this many tokens or fewer (a decode step's one token, as a stream mostly brings) is
# detokenized on the event loop: a push decodes a window of a few ids, 6.6 us a token with the Kimi
# small tokenizer, while a hop to the pool and back cost 148 us of CPU a token (threads woken, the
# loop's self-pipe), 0.1 of a core at the 800 tokens/s a 16-stream burst's decode tail streams.
INLINE_TOKENS = 8


async def stream_completion(orchestrator: Orchestrator, tokenizer, job: Job, stops: tuple[str, ...],
                            offload: Offload | None = None) -> AsyncIterator[Delta | Final]:
    """`offload`: where detokenization of events of more than INLINE_TOKENS tokens runs (the router's
    CPU pool; inline when None, in tests)."""
    started = time.monotonic()
    last_sent: float | None = None
    detok = IncrementalDetokenizer(tokenizer)
    matcher = StopMatcher(stops)
    prompt_tokens, completion_tokens, finish = 0, 0, None
    events = orchestrator.run(job)
    try:
        async for event in events:
            prompt_tokens = prompt_tokens or event.prompt_tokens
            completion_tokens += len(event.token_ids)
            args = (detok, matcher, event.token_ids, event.finish_reason)
            if offload and len(event.token_ids) > INLINE_TOKENS:
                text, finish = await offload.run(_advance, *args)
            else:
                text, finish = _advance(*args)
            if text or event.token_ids:
                now = time.monotonic()
                if last_sent is None:
                    metrics.TTFT.observe(now - started)
                else:
                    metrics.INTER_TOKEN.observe(now - last_sent)
                last_sent = now
                yield Delta(text, list(event.token_ids))
            if finish is not None:
                break
    finally:
        await aclose_quietly(events)  # a stop string or a gone client ends the decode stream here
    if finish in (None, "cancelled"):
        # Not the client's doing (that closes this generator instead): a worker cut the answer short.
        # Calling it "stop" would pass a truncated answer off as a natural end.
        raise UpstreamError(grpc.StatusCode.CANCELLED if finish else grpc.StatusCode.INTERNAL,
                            "the decode worker cancelled the request" if finish
                            else "the token stream ended without a finish reason")
    metrics.E2E.observe(time.monotonic() - started)
    yield Final(finish, prompt_tokens, completion_tokens)


def _advance(detok: IncrementalDetokenizer, matcher: StopMatcher, token_ids, finish_reason: str | None
             ) -> tuple[str, str | None]:
    """The text new tokens add (cut at a stop string) and the finish reason so far.

    One event's tokens are handled by one call, in order, so the detokenizer's state is never
    touched by two threads at once.
    """
    text, stopped = matcher.feed(detok.push(token_ids))
    finish = "stop" if stopped else finish_reason
    if finish is not None and not stopped:
        tail, _ = matcher.feed(detok.flush())
        text += tail + matcher.flush()
    return text, finish
