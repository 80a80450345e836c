"""Python's cycle collector in a server process: off while it loads, its startup heap frozen after.

A worker that has imported transformers and loaded a model holds about 400,000 objects the
collector tracks, nearly all of them alive until the process ends. A full collection walks every
one, with the GIL held: 240 ms in a process holding the small Kimi checkpoint's language model,
0.34-0.58 s in `epd serve`'s workers (machine F). Once serving, such a pause stalls the engine
loop, every stream's next token and the health checks alike (vLLM and SGLang freeze their startup
heap for the same reason). While loading, the collections that the allocations set off walk the
ever larger heap again and again: 1.7-2.1 s of each model worker's CPU before it was ready, 6.2 s
over `epd serve`'s four processes (one collection each now, 1.8 s in all; ready in 14.9-15.4 s
against 15.7, alternating 4 times each).

So a serving command turns the collector off before it imports and loads anything; the process,
once loaded, collects once, moves every object still alive out of the collector's sight
(`gc.freeze`) and turns it back on: later collections walk only what serving allocates. The
freeze comes before the warm-up, whose compiles (torch._dynamo) ask for collections themselves.
"""

from __future__ import annotations

import gc


def defer_collection() -> None:
    """No cycle collection until `freeze_startup_heap` (reference counting still frees the rest)."""
    gc.disable()


def freeze_startup_heap() -> None:
    """Collect once, exempt every survivor from later collections, and collect as usual from now on."""
    gc.collect()
    gc.freeze()
    gc.enable()
