"""The router exports `epd_workers{role, state}`: counts per pair, 0 where none (no stale series)."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from router.workers import WorkerRegistry, WorkerSpec


def count(role: str, state: str) -> float:
    return REGISTRY.get_sample_value("epd_workers", {"role": role, "state": state})


def test_worker_states_are_counted_and_reset():
    async def scenario():
        registry = WorkerRegistry([])
        registry.set_members("dns", [WorkerSpec("decode", "127.0.0.1:1"), WorkerSpec("decode", "127.0.0.1:2")])
        registry.workers[0].state = "ready"
        registry.export_states()
        assert count("decode", "ready") == 1 and count("decode", "starting") == 1 and count("encoder", "ready") == 0
        registry.set_members("dns", [])
        registry.export_states()
        assert count("decode", "draining") == 2 and count("decode", "ready") == 0
        await registry.poll_once()  # drained with nothing in flight: removed, and counted as gone
        assert registry.workers == [] and count("decode", "draining") == 0
        await registry.close()

    asyncio.run(scenario())
