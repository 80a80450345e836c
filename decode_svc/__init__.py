"""Decode service: takes over the KV cache and streams tokens (next issue)."""
