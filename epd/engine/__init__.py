"""The serving engine (sequences, KV blocks, scheduler, paged cache, packed forward) and the in-process path."""
