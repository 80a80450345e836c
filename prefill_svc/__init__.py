"""Prefill service: prompts through the engine in batches (chunked when long); the KV blocks handed off."""
