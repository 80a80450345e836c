"""The collector is off while a server loads; once it is ready only what serving allocates is walked."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest

from epd import cli, heap


@pytest.fixture
def collector_restored():
    yield
    gc.unfreeze()
    gc.enable()


def _walked_ids() -> set[int]:
    """Every object the collector's generations hold (the frozen ones are in none of them)."""
    return {id(obj) for obj in gc.get_objects()}


def test_deferred_then_frozen(collector_restored):
    heap.defer_collection()
    assert not gc.isenabled()
    startup = [[i] for i in range(1000)]  # alive at start-up, and tracked
    assert id(startup[0]) in _walked_ids()
    heap.freeze_startup_heap()
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(startup)
    walked = _walked_ids()
    assert not any(id(item) in walked for item in startup)
    served = [0]  # allocated after: walked as usual
    assert id(served) in _walked_ids()


def test_cycles_made_before_the_freeze_are_freed_not_frozen(collector_restored):
    class Node:
        pass

    heap.defer_collection()
    node = Node()
    node.self = node  # garbage only a collection can free
    del node
    assert any(type(obj) is Node for obj in gc.get_objects())
    heap.freeze_startup_heap()
    gc.unfreeze()  # the frozen objects back into view: the cycle is not among them
    assert not any(type(obj) is Node for obj in gc.get_objects())


def _collector_state_in_run(command: str, monkeypatch) -> bool:
    """Whether the collector was on when `epd COMMAND`'s run began (the run itself replaced)."""
    seen = []
    parser = cli.build_parser()
    run = lambda args: seen.append(gc.isenabled()) or 0  # noqa: E731
    monkeypatch.setattr(parser, "parse_args", lambda argv: SimpleNamespace(command=command, run=run))
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    assert cli.main([command]) == 0
    return seen[0]


@pytest.mark.parametrize("command", sorted(cli.SERVICE_MODULES))
def test_every_server_command_loads_with_the_collector_off(command, monkeypatch, collector_restored):
    assert _collector_state_in_run(command, monkeypatch) is False


@pytest.mark.parametrize("command", ["bench", "generate", "serve"])
def test_other_commands_keep_the_collector_on(command, monkeypatch, collector_restored):
    assert _collector_state_in_run(command, monkeypatch) is True
