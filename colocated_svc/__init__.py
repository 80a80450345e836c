"""The colocated worker: encoder, prefill and decode in one process over one engine (the baseline)."""
