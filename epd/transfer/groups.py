"""Two-rank torch.distributed groups for point-to-point transfers, built without the default group.

`torch.distributed.init_process_group` is one per process, and `new_group` needs every rank of that
world to take part: neither fits a worker that pairs up with arbitrary peers over its life. So a
pair builds its backend object directly from a TCP store of its own (as vLLM's and SGLang's KV
connectors do): `ProcessGroupNCCL(store, rank, 2, ...)` between GPUs, `ProcessGroupGloo` between
CPUs. Rank 0 is the owner of the bytes (it hosts the store), rank 1 the puller.
"""

from __future__ import annotations

import datetime
import logging

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

OWNER_RANK = 0
PULLER_RANK = 1


def local_backends() -> list[str]:
    """The group backends this process can use, best first: nccl needs CUDA, gloo works everywhere."""
    backends = []
    if torch.cuda.is_available() and dist.is_nccl_available():
        backends.append("nccl")
    if dist.is_gloo_available():
        backends.append("gloo")
    return backends


def choose_backend(theirs: list[str]) -> str | None:
    """The first of this process's backends that the peer also has; None when they share none."""
    return next((b for b in local_backends() if b in theirs), None)


def _timeout(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def master_store(host: str, timeout_s: float) -> dist.TCPStore:
    """A store for one pair, listening on `host` at a free port (`.port`); the owner keeps it for the group's life."""
    return dist.TCPStore(host, 0, 2, True, timeout=_timeout(timeout_s), wait_for_workers=False)


def client_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """The puller's end of a pair's store (connects, retrying up to `timeout_s`)."""
    return dist.TCPStore(host, port, 2, False, timeout=_timeout(timeout_s))


def make_group(backend: str, store: dist.Store, rank: int, timeout_s: float, host: str = "127.0.0.1",
               device: torch.device | None = None):
    """The 2-rank backend object for `rank`; blocks until the other rank has joined (bounded by `timeout_s`).

    `host`: the address gloo binds its own connections to (the worker's host, so no interface guessing).
    `device`: the CUDA device of an nccl group.
    """
    if backend == "gloo":
        options = dist.ProcessGroupGloo._Options()
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
        options._timeout = _timeout(timeout_s)
        return dist.ProcessGroupGloo(store, rank, 2, options)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = _timeout(timeout_s)
        group = dist.ProcessGroupNCCL(store, rank, 2, options)
        if device is not None and hasattr(group, "eager_connect_single_device"):
            group.eager_connect_single_device(device)  # connect now, not at the first send
        return group
    raise ValueError(f"group backend {backend!r} is not nccl or gloo")


def drop_group(group) -> None:
    """Tear a group down so a dead or misbehaving peer holds nothing of ours (errors are only logged)."""
    for name in ("abort", "shutdown"):
        method = getattr(group, name, None)
        if method is None:
            continue
        try:
            method()
            return
        except Exception as exc:  # a group whose peer is gone may refuse a clean shutdown
            logger.debug("group %s() failed: %s", name, exc)
