"""Prefill service: runs the prompt through the language model and hands off the KV cache (next issue)."""
