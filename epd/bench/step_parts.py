"""Where a step's time goes by part of the model (attention's projections, the experts, the router, the
LM head, ...), summed over layers: what `epd bench decode --profile` prints beside the operator table.

The operator table says which kernels cost (`bmm`, `index_select`), not which part of the model
called them; a part is what a change aims at. Forward hooks time every module of the language model
while a few steps run. A module's own time is its time less that of its timed children (a
layer's own time is its residual adds; `self_attn`'s is its rotary embedding, KV cache and
attention core, around the projections; `mlp`'s is the routing and combining around the router and
the experts). Modules are named by their path below the decoder layer, so the six layers'
`self_attn.q_proj` add up to one line. Functions that are not modules can be timed as children of
their caller: `epd bench decode` times the KV cache's `update` (writing the new tokens' keys and
values into the pool and gathering every context), which leaves `self_attn`'s own time to the
rotary embedding and the attention core. What the step spends outside the model (packing the batch,
sampling, scheduling) is the step's time less the model's.

The hooks cost a few microseconds per module call, so the parts add up to a little more than an
unhooked step; the timed step runs on the calling thread, whose torch ops finish before they return
on a CPU (on a GPU the figures would be launch times, so this is for CPU steps).
"""

from __future__ import annotations

import re
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

OUTSIDE = "outside the model (packing, sampling, scheduling)"
ROOT = "the model's own forward (around its modules)"
_LAYER = re.compile(r"(?:^|\.)layers\.\d+(?:\.|$)")


def part_of(name: str) -> str:
    """A module's part: its path below its decoder layer ("layer" for the layer itself), else its
    last two path components (ROOT for the root, named ""); pure."""
    match = _LAYER.search(name)
    if match:
        below = name[match.end():]
        return f"layer.{below}" if below else "layer"
    return ".".join(name.split(".")[-2:]) if name else ROOT


def own_times(inclusive: dict[str, float]) -> dict[str, float]:
    """Each timed module's time less its timed children's ({dotted name: seconds} in, the same out); pure.

    A child is the nearest timed descendant: with "a", "a.b.c" timed and "a.b" not, "a.b.c" is a child
    of "a". The root module is named ""."""
    own = dict(inclusive)
    for name, seconds in inclusive.items():
        parent = _timed_parent(name, inclusive)
        if parent is not None:
            own[parent] -= seconds
    return own


def _timed_parent(name: str, timed: dict[str, float]) -> str | None:
    if not name:
        return None
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        candidate = ".".join(parts[:cut])
        if candidate in timed:
            return candidate
    return "" if "" in timed else None


def by_part(own: dict[str, float]) -> dict[str, float]:
    """Own times summed per `part_of` name; pure."""
    parts: dict[str, float] = defaultdict(float)
    for name, seconds in own.items():
        parts[part_of(name)] += seconds
    return dict(parts)


@dataclass(frozen=True)
class StepParts:
    step_s: float  # median hooked step
    parts: dict[str, float]  # seconds per step (mean over the steps), OUTSIDE included


def time_parts(model: torch.nn.Module, step: Callable[[], object], steps: int = 5,
               calls: Sequence[tuple[object, str, str]] = ()) -> StepParts:
    """Run `step` `steps` times with every module of `model` timed; seconds per step by part.

    `calls`: (owner, attribute, label) of functions that are not modules, timed as children of the
    module that calls them (the KV cache's `update`, under `self_attn`: "layer.self_attn.(label)")."""
    names = {id(module): name for name, module in model.named_modules()}
    totals: dict[str, float] = defaultdict(float)
    running: list[tuple[str, float]] = []  # (module name, start) of the modules inside one another now

    def before(module, args, kwargs=None):
        running.append((names[id(module)], time.perf_counter()))

    def after(module, args, output, kwargs=None):
        name, begun = running.pop()
        totals[name] += time.perf_counter() - begun

    def timed(function: Callable, label: str) -> Callable:
        def call(*args, **kwargs):
            begun = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                caller = running[-1][0] if running else ""
                totals[f"{caller}.({label})" if caller else f"({label})"] += time.perf_counter() - begun
        return call

    hooks = [h for module in model.modules()
             for h in (module.register_forward_pre_hook(before), module.register_forward_hook(after))]
    patched = [(owner, attribute, owner.__dict__.get(attribute)) for owner, attribute, _ in calls]
    for owner, attribute, label in calls:
        setattr(owner, attribute, timed(getattr(owner, attribute), label))
    step_times = []
    try:
        for _ in range(steps):
            begun = time.perf_counter()
            step()
            step_times.append(time.perf_counter() - begun)
    finally:
        for hook in hooks:
            hook.remove()
        for owner, attribute, original in patched:  # back to the class's method (or what the instance had)
            if original is None:
                delattr(owner, attribute)
            else:
                setattr(owner, attribute, original)
    parts = {name: seconds / steps for name, seconds in by_part(own_times(dict(totals))).items()}
    parts[OUTSIDE] = (sum(step_times) - totals.get("", 0.0)) / steps  # the root's time is the whole forward
    return StepParts(statistics.median(step_times), parts)


def format_parts(result: StepParts, batch: int, limit: int = 16, always: Sequence[str] = ()) -> str:
    """The parts as a table, largest first; the rest folded into one line, except the parts of the
    timed calls labelled in `always` (what a profile was asked to separate stays visible however small)."""
    ranked = sorted(result.parts.items(), key=lambda item: -item[1])
    kept = tuple(f"({label})" for label in always)
    shown, rest = [], []
    for rank, item in enumerate(ranked):
        (shown if rank < limit or item[0].endswith(kept) else rest).append(item)
    total = sum(result.parts.values())
    lines = [f"where a decode step's time goes at batch {batch}, by part, summed over layers "
             f"(hooked step {result.step_s * 1000:.1f} ms; `layer.X` is X in every decoder layer, "
             "a module's own time excludes its children's):"]
    for name, seconds in shown:
        lines.append(f"  {name:<52s} {seconds * 1000:7.2f} ms  {seconds / total:5.1%}")
    if rest:
        seconds = sum(s for _, s in rest)
        lines.append(f"  {f'{len(rest)} more':<52s} {seconds * 1000:7.2f} ms  {seconds / total:5.1%}")
    return "\n".join(lines)
