"""When `epd serve` restarts a worker that died, and when it stops trying: pure policy, no processes.

A worker that dies after it was ready is restarted, after a delay that doubles with each quick
death in a row (a crash loop must not eat the cores the live workers need) and resets once a
restart stays up for `stable_s`. A worker that dies before it ever became ready again counts as a
failure at start; `give_up_after` of those in a row mean restarting cannot help (a bad checkpoint,
a port taken by someone else), so the launcher gives up on it and says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RestartPolicy:
    base_s: float = 0.5  # the first restart's delay
    max_s: float = 10.0  # the delay never grows beyond this
    give_up_after: int = 5  # failures at start in a row
    stable_s: float = 30.0  # up this long after ready: the next death starts the backoff afresh

    def __post_init__(self) -> None:
        if not 0 <= self.base_s <= self.max_s or self.give_up_after < 1 or self.stable_s < 0:
            raise ValueError(f"bad restart policy {self}")


@dataclass
class RestartState:
    """One worker's history under the policy."""

    restarts: int = 0  # times it was started again
    start_failures: int = 0  # deaths before ready, in a row
    quick_deaths: int = 0  # deaths in a row, each before it had been up `stable_s`
    exits: list[str] = field(default_factory=list)  # why each of the failures at start happened, for the message

    def on_exit(self, policy: RestartPolicy, code: int, was_ready: bool, up_s: float) -> float | None:
        """Seconds to wait before starting it again, or None: give up.

        `was_ready`: it had become ready since its last start; `up_s`: seconds since then.
        """
        if was_ready:
            self.start_failures, self.exits = 0, []
            if up_s >= policy.stable_s:
                self.quick_deaths = 0
        else:
            self.start_failures += 1
            self.exits.append(f"exit code {code}")
            if self.start_failures >= policy.give_up_after:
                return None
        self.quick_deaths += 1
        return min(policy.base_s * 2 ** (self.quick_deaths - 1), policy.max_s)

    def give_up_reason(self) -> str:
        return f"it failed {self.start_failures} times in a row before becoming ready ({', '.join(self.exits)})"
