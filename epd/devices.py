"""`--device` for every worker and `epd serve --gpus`: where a worker's model, KV pool and tensors live.

Pure parsing here; torch is imported only by `resolve_device`, when a worker actually starts.
"""

from __future__ import annotations

import re

DEVICE_HELP = "where the model, its KV pool and transfers live: auto (cuda if available, else cpu), cpu, cuda[:N]"
_DEVICE_RE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


def check_device(name: str) -> str:
    """`name` itself if it is a --device spelling; ValueError naming the flag otherwise."""
    if not _DEVICE_RE.fullmatch(name):
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}")
    return name


def resolve_device(name: str, cuda_count: int | None = None):
    """The torch.device for a --device value; ValueError for a CUDA device this machine does not have."""
    import torch

    check_device(name)
    count = torch.cuda.device_count() if cuda_count is None else cuda_count
    if name == "auto":
        return torch.device("cuda", 0) if count else torch.device("cpu")
    if name == "cpu":
        return torch.device("cpu")
    index = int(name.partition(":")[2] or 0)
    if index >= count:
        raise ValueError(f"--device {name}: this machine has {count} CUDA device(s) visible")
    return torch.device("cuda", index)


def parse_gpus(spec: str, visible: int) -> list[int]:
    """`--gpus auto|0,1,…` -> GPU indices (auto: every visible one; none on a CPU machine)."""
    if spec == "auto":
        return list(range(visible))
    try:
        gpus = [int(part) for part in spec.split(",")]
    except ValueError:
        raise ValueError(f"--gpus must be auto or comma-separated GPU indices like 0,1, got {spec!r}") from None
    if any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise ValueError(f"--gpus {spec!r}: indices must be distinct and >= 0")
    return gpus


def assign_gpus(workers: list[tuple[str, str]], gpus: list[int]) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES per worker name, from (name, role) pairs in start order.

    Workers take the GPUs round-robin, so with as many GPUs as workers each has its own, and with
    fewer they share (a worker sees one GPU, as cuda:0). The router gets none. With no GPUs every
    worker gets "" (CPU only), so a worker never grabs a GPU it was not given.
    """
    plan: dict[str, str] = {}
    workers = [(name, role) for name, role in workers if role != "router"]
    for i, (name, _) in enumerate(workers):
        plan[name] = str(gpus[i % len(gpus)]) if gpus else ""
    return plan


def visible_gpus() -> int:
    """GPUs this process can see, without initializing CUDA in it (the launcher's children use them)."""
    import os
    import subprocess

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([part for part in visible.split(",") if part.strip()])
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return 0  # no driver, no GPUs
    return len(out.split())


def use_device(device):
    """Make `device` this process's current CUDA device (NCCL groups and bare `cuda` tensors use it)."""
    import torch

    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device
