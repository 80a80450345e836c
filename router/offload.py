"""A bounded thread pool for the router's CPU work, so the event loop only ever waits on I/O.

JSON parsing, base64 decoding, image decoding, the chat template, tokenization and the
detokenization of many tokens at once are each milliseconds (a 20 MB body: hundreds). On the event
loop they stall every other stream's tokens and every health check; here they run on `threads`
threads. Work of microseconds stays on the loop, where a hop here would cost more than the work
(router.completion.INLINE_TOKENS: a streamed token's detokenization). The queue in
front of them is bounded by the router's admission limit (each admitted request has at most a few
items waiting), so it needs no bound of its own.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class Offload:
    def __init__(self, threads: int = 4) -> None:
        if threads < 1:
            raise ValueError(f"Offload threads must be >= 1, got {threads}")
        self.threads = threads
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="epd-router-cpu")

    async def run(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """`fn(*args, **kwargs)` on the pool; exceptions propagate to the caller unchanged."""
        call = functools.partial(fn, *args, **kwargs) if kwargs else (lambda: fn(*args))
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
