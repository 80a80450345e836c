"""128 concurrent streams against a cluster sized for 8: the excess is refused at once with 429 and
Retry-After, every accepted stream completes, and no worker is ever taken out of routing."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.e2e.cluster import start_cluster, worker_states


@pytest.fixture(scope="module")
def small_cluster(e2e_dirs):
    # Each stream holds ceil((~25 prompt + 200) / 16) = 15 KV blocks to its end: 121 blocks (one is
    # reserved) hold 8 of them, and at most 8 sequences decode at once. Sized for 32, the decode
    # worker once finished streams as fast as the prefill worker handed new ones over, and all 128
    # were admitted in turn (CI, 2026-12-06): with 8 slots it frees them 4x slower than that.
    cluster = start_cluster(e2e_dirs["kimi_k25"], "--kv-blocks", "121", "--max-running", "8")
    yield cluster
    cluster.stop()


def stream(url: str, index: int) -> tuple[int, str | None, str]:
    """(HTTP status, Retry-After, how the stream ended: its finish_reason, or the error)."""
    body = {"messages": [{"role": "user", "content": f"Count to a hundred, take {index}."}], "max_tokens": 200,
            "ignore_eos": True, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as reply:
        if reply.status_code != 200:
            reply.read()
            return reply.status_code, reply.headers.get("retry-after"), reply.text
        ended = "no finish_reason"
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return 200, None, f"error chunk {chunk['error']}"
                for choice in chunk["choices"]:
                    ended = choice.get("finish_reason") or ended
        return 200, None, ended


def test_the_excess_gets_429_with_retry_after_and_the_rest_completes(small_cluster):
    url = small_cluster.url
    states_seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            states_seen.update(worker_states(url).values())
            time.sleep(0.1)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(128) as pool:
            results = list(pool.map(lambda i: stream(url, i), range(128)))
    finally:
        done.set()
        watcher.join()
    accepted = [r for r in results if r[0] == 200]
    refused = [r for r in results if r[0] != 200]
    assert refused, "nothing was refused: the cluster was not saturated"
    assert {(status, retry_after) for status, retry_after, _ in refused} == {(429, "1")}, refused[:3]
    assert len(accepted) >= 8 and all(ended == "length" for _, _, ended in accepted), accepted
    assert states_seen == {"ready"}, f"a worker left routing under load: {states_seen}"
    print(f"{len(accepted)} accepted and completed, {len(refused)} refused with 429")
