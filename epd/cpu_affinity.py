"""Which CPUs each process of `epd serve` may run on (`--cpu-affinity`): pure, no OS calls.

On one machine the roles share cores; pinning decode workers to cores of their own is how separate
accelerators are stood in for: a vision forward or a long prefill then cannot delay the next
decode step. `auto` gives decode workers half the CPUs (rounded up) and everything else the rest;
`ROLE=CPUS,...` says it explicitly (`decode=1,encoder=0,prefill=0,router=0`; CPUS like `2-3` or
`0+2`). A role not named keeps every CPU.
"""

from __future__ import annotations

ROLES = ("encoder", "prefill", "decode", "router", "colocated")


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """`0-2+5` -> (0, 1, 2, 5); ValueError naming what is wrong."""
    cpus: list[int] = []
    for part in text.split("+"):
        first, dash, last = part.partition("-")
        try:
            lo, hi = int(first), int(last if dash else first)
        except ValueError:
            raise ValueError(f"bad CPU list {text!r}: use numbers, ranges like 2-3, joined with +") from None
        if lo < 0 or hi < lo:
            raise ValueError(f"bad CPU range {part!r} in {text!r}")
        cpus.extend(range(lo, hi + 1))
    return tuple(sorted(set(cpus)))


def parse_spec(spec: str) -> dict[str, tuple[int, ...]]:
    """`decode=1,encoder=0` -> {"decode": (1,), "encoder": (0,)}."""
    plan: dict[str, tuple[int, ...]] = {}
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        role, sep, cpus = entry.partition("=")
        if not sep or role not in ROLES:
            raise ValueError(f"bad --cpu-affinity entry {entry!r}: expected ROLE=CPUS with ROLE one of {ROLES}")
        plan[role] = parse_cpu_list(cpus)
    return plan


def plan_affinity(spec: str, processes: list[tuple[str, str]], cpus: list[int]) -> dict[str, tuple[int, ...]]:
    """CPUs per process name. `processes`: (name, role) in start order; `cpus`: those this machine offers."""
    if spec == "auto":
        return _auto(processes, cpus)
    plan = parse_spec(spec)
    missing = sorted({c for chosen in plan.values() for c in chosen} - set(cpus))
    if missing:
        raise ValueError(f"--cpu-affinity names CPUs {missing}, which this machine does not offer ({cpus})")
    return {name: plan.get(role, tuple(cpus)) for name, role in processes}


def _auto(processes: list[tuple[str, str]], cpus: list[int]) -> dict[str, tuple[int, ...]]:
    decodes = [name for name, role in processes if role == "decode"]
    if len(cpus) < 2 or not decodes:
        return {name: tuple(cpus) for name, _ in processes}
    split = len(cpus) - (len(cpus) + 1) // 2  # decode gets the upper half, rounded up
    rest, decode_cpus = cpus[:split], cpus[split:]
    plan = {name: tuple(rest) for name, role in processes if role != "decode"}
    share = max(len(decode_cpus) // len(decodes), 1)
    for index, name in enumerate(decodes):
        start = (index * share) % len(decode_cpus)
        plan[name] = tuple(decode_cpus[start:start + share])
    return plan
