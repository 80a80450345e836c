"""Decode service: imported KV blocks join the engine's running batch; every stream's tokens from one forward."""
