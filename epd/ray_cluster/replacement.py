"""Replacing a Ray worker that died, under the same restart policy as `epd serve` (epd.supervision).

Without a backoff a worker that dies right after becoming ready is replaced as fast as it can load,
and one whose replacement cannot start (a bad checkpoint, a node with no room) leaves its role a
worker short with nothing but a log line. Here the replacement waits the policy's delay (doubling
with quick deaths in a row), a replacement that fails to start is tried again after a longer one,
and after `give_up_after` failures in a row the controller gives up on that slot and says why.
Pure: the caller passes how to start one and how to wait, so it is tested without Ray.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from epd.supervision import RestartPolicy, RestartState

log = logging.getLogger(__name__)

STARTED, STOPPING = "started", "stopping"


def replace_with_backoff(start: Callable[[], object], history: RestartState, policy: RestartPolicy, code: int,
                         up_s: float, wait: Callable[[float], bool]) -> str:
    """Start a replacement for a worker that exited with `code` after `up_s` seconds of being ready.

    `wait(seconds)` sleeps and returns True when the cluster is stopping. Returns STARTED, STOPPING,
    or the reason it gave up.
    """
    delay = history.on_exit(policy, code, was_ready=True, up_s=up_s)
    while True:
        if wait(delay):
            return STOPPING
        try:
            start()
        except Exception as exc:  # noqa: BLE001 - whatever stopped it, the policy decides what comes next
            delay = history.on_exit(policy, -1, was_ready=False, up_s=0.0)
            history.exits[-1] = f"{type(exc).__name__}: {exc}"[:300]
            if delay is None:
                return history.give_up_reason()
            log.warning("a replacement did not start (%s); trying again in %.1f s", history.exits[-1], delay)
            continue
        history.restarts += 1
        return STARTED
