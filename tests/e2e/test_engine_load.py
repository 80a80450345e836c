"""Under load, through real processes: 64 concurrent streams on one decode worker all equal their
transformers references, while health checks keep answering (no worker is ever taken out of
routing); and the colocated worker serves the same answers as the disaggregated cluster."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx
import openai
import pytest

from tests.e2e.cluster import start_cluster
from tests.e2e.conftest import data_url, openai_messages, pattern_image, reference

TOKENS = 48


def _stream_ids(client: openai.OpenAI, family: str, image: int | None, text: str) -> list[int]:
    urls = [] if image is None else [data_url(pattern_image(image))]
    stream = client.chat.completions.create(
        model=family, messages=openai_messages(urls, text), max_tokens=TOKENS, temperature=0, stream=True,
        extra_body={"return_token_ids": True})
    # token_ids ride on the stream choice (vLLM's shape), not in the delta
    return [t for chunk in stream for c in chunk.choices for t in ((c.model_extra or {}).get("token_ids") or [])]


def _requests(count: int) -> list[tuple[int | None, str]]:
    """Mixed requests: every third is text-only, the rest carry one of 16 images; texts vary in length."""
    texts = ["What is in this picture?", "Describe it.", "Tell me everything you see, in order, slowly."]
    return [(None if i % 3 == 0 else i % 16, texts[i % 3]) for i in range(count)]


class _WorkerWatch:
    """Polls the router's /workers once before the load, every 50 ms during it and once after it, and
    remembers every state other than ready. The load lasts about a second on 2 cores and a poll can
    take a few hundred ms to answer then: a fixed count of polls at a fixed period was flaky (2 of 3 in
    a CI run), so the count that matters is the polls answered while the streams ran."""

    def __init__(self, url: str) -> None:
        self.url, self.bad, self.polls = url, [], 0
        self._stop, self._first = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._first.wait(10), "the router's /workers did not answer before the load"

    def _poll(self) -> None:
        for w in httpx.get(f"{self.url}/workers", timeout=5).json()["workers"]:
            if w["state"] != "ready":
                self.bad.append((w["role"], w["state"], w["last_error"]))
        self.polls += 1

    def _run(self) -> None:
        while True:
            self._poll()
            self._first.set()
            if self._stop.wait(0.05):
                break
        self._poll()  # after the load too: a worker taken out near its end is still out then

    def stop(self) -> int:
        """Stop polling; returns how many polls were answered while the load ran."""
        self._stop.set()
        self._thread.join(10)
        return self.polls - 2


@pytest.mark.parametrize("family", ["kimi_k25", "qwen3_vl_moe"])
def test_sixty_four_concurrent_streams_equal_their_references(family, e2e_dirs):
    model_dir = e2e_dirs[family]
    requests = _requests(64)
    expected = {r: reference(model_dir, () if r[0] is None else (r[0],), TOKENS, r[1])[0] for r in set(requests)}
    cluster = start_cluster(model_dir)
    try:
        client = openai.OpenAI(base_url=cluster.base_url, api_key="unused", max_retries=0, timeout=300)
        watch = _WorkerWatch(cluster.url)
        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            got = list(pool.map(lambda r: _stream_ids(client, family, *r), requests))
        during_load = watch.stop()
        for index, (request, ids) in enumerate(zip(requests, got, strict=True)):
            assert ids == expected[request], f"stream {index} ({request}) differs from transformers"
        assert during_load >= 1 and watch.bad == [], f"workers left routing under load: {watch.bad[:5]}"
        decode = next(w for w in httpx.get(f"{cluster.url}/workers").json()["workers"] if w["role"] == "decode")
        metrics = httpx.get(decode["metrics_url"]).text
        batched = [line for line in metrics.splitlines() if line.startswith('epd_batch_size_bucket{le="8.0"')]
        count = [line for line in metrics.splitlines() if line.startswith('epd_batch_size_count{role="decode"}')]
        assert batched and count and float(batched[0].split()[-1]) < float(count[0].split()[-1]), \
            "the decode worker never ran more than 8 sequences in one forward"
    finally:
        assert cluster.stop() == 0


def test_colocated_worker_equals_transformers(e2e_dirs):
    family, model_dir = "qwen3_vl_moe", e2e_dirs["qwen3_vl_moe"]
    requests = _requests(12)
    cluster = start_cluster(model_dir, "--colocated")
    try:
        workers = httpx.get(f"{cluster.url}/workers").json()["workers"]
        assert sorted(w["role"] for w in workers) == ["decode", "encoder", "prefill"]
        assert len({w["address"] for w in workers}) == 1, "colocated: one process serves every role"
        client = openai.OpenAI(base_url=cluster.base_url, api_key="unused", max_retries=0, timeout=300)
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            got = list(pool.map(lambda r: _stream_ids(client, family, *r), requests))
        assert time.monotonic() - started < 120
        for request, ids in zip(requests, got, strict=True):
            assert ids == reference(model_dir, () if request[0] is None else (request[0],), TOKENS, request[1])[0]
    finally:
        assert cluster.stop() == 0
