"""Cluster against the in-process path, same checkpoint, same requests (one image, N tokens, greedy).

Medians over sequential requests, then the wall time of 16 concurrent ones:
    .venv/bin/python scripts/bench_cluster.py DIR [--transfer grpc|shm] [--requests 10] [--tokens 32]
The in-process path (`InProcessPipeline`) is the baseline; the cluster is `epd serve` on loopback.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import openai  # noqa: E402

from epd.engine.pipeline import InProcessPipeline  # noqa: E402
from epd.engine.sampling import SamplingParams  # noqa: E402
from tests.e2e.cluster import start_cluster  # noqa: E402
from tests.e2e.conftest import data_url, pattern_image  # noqa: E402

QUESTION = "What is in this picture?"


def in_process(model_dir: str, requests: int, tokens: int) -> list[float]:
    pipeline = InProcessPipeline(model_dir)
    message = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    times = []
    for i in range(requests):
        started = time.perf_counter()
        pipeline.chat(message, [pattern_image(200 + i)], SamplingParams(max_tokens=tokens, ignore_eos=True))
        times.append(time.perf_counter() - started)
    return times


def one_request(client: openai.OpenAI, model: str, index: int, tokens: int) -> tuple[float, float]:
    """(time to the first content chunk, end to end) of one streamed request."""
    started, first = time.perf_counter(), None
    image = {"type": "image_url", "image_url": {"url": data_url(pattern_image(index))}}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": QUESTION}]}]
    for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=tokens, temperature=0,
                                                stream=True, extra_body={"ignore_eos": True}):
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - started
    return first or 0.0, time.perf_counter() - started


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model_dir")
    p.add_argument("--transfer", choices=("grpc", "shm"), default="grpc")
    p.add_argument("--requests", type=int, default=10)
    p.add_argument("--tokens", type=int, default=32)
    args = p.parse_args()
    baseline = in_process(args.model_dir, args.requests, args.tokens)
    cluster = start_cluster(args.model_dir, "--transfer", args.transfer)
    try:
        client = openai.OpenAI(base_url=cluster.base_url, api_key="unused", max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        runs = [one_request(client, model, 300 + i, args.tokens) for i in range(args.requests)]
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            started = time.perf_counter()
            list(pool.map(lambda i: one_request(client, model, 400 + i, args.tokens), range(16)))
            wall16 = time.perf_counter() - started
    finally:
        cluster.stop()
    med = statistics.median
    e2e, ttft = med(r[1] for r in runs), med(r[0] for r in runs)
    print(f"{args.model_dir} ({args.transfer}, {args.tokens} tokens): in-process {med(baseline) * 1000:.0f} ms, "
          f"cluster {e2e * 1000:.0f} ms (x{e2e / med(baseline):.2f}), cluster TTFT {ttft * 1000:.0f} ms; "
          f"16 concurrent: {wall16:.2f} s, {16 * args.tokens / wall16:.0f} tokens/s "
          f"(in-process one at a time: {args.tokens / med(baseline):.0f} tokens/s)")


if __name__ == "__main__":
    main()
