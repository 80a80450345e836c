"""The reference point: plain transformers `generate`, one request at a time, in this process.

This is what a user gets without any serving system: processor chat template + `generate`, greedy,
with no end-of-sequence token, which is what `ignore_eos` means to a server (ours, vLLM): every
request makes exactly N tokens, and an end-of-sequence token the model picks is kept and
generation goes on. (`min_new_tokens=N` would also make N tokens, but by masking those tokens' logits,
so wherever one is the greedy pick its output parts from every server's: seen on Qwen small, float32,
1 request of 48, at token 31.) A streamer
timestamps each new token, so TTFT and inter-token gaps mean what they mean over HTTP (TTFT
includes the processor, as the server's includes image decoding and processing).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from transformers.generation.streamers import BaseStreamer

from epd.bench.results import RequestResult
from epd.bench.workloads import BenchRequest


class TokenTimer(BaseStreamer):
    """Records when each new token leaves `generate` (its first `put` is the prompt: skipped)."""

    def __init__(self) -> None:
        self.prompt_seen = False
        self.times: list[float] = []

    def put(self, value) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


class HfBaseline:
    """A model and processor loaded once; `generate_one` runs a request, `run` a list in order."""

    def __init__(self, model_dir: str, dtype: str = "auto") -> None:
        from transformers import AutoModelForImageTextToText, AutoProcessor
        from transformers.utils import logging as hf_logging

        from epd.dtypes import resolve_dtype

        hf_logging.disable_progress_bar()
        self.processor = AutoProcessor.from_pretrained(model_dir)
        self.dtype = resolve_dtype(dtype)
        self.model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=self.dtype).eval()
        self.model.generation_config.eos_token_id = None  # ignore_eos: nothing stops generation, nothing is masked

    def inputs(self, request: BenchRequest):
        """The processor's model inputs for `request`: its chat template, tokenized, with pixel values."""
        return self.processor.apply_chat_template(
            request.hf_messages(), tokenize=True, add_generation_prompt=True, return_dict=True,
            return_tensors="pt").to(self.dtype)  # casts the pixel values only; ids stay integers

    @torch.inference_mode()
    def generate_one(self, request: BenchRequest, output_len: int) -> RequestResult:
        started = time.perf_counter()
        timer = TokenTimer()
        try:
            inputs = self.inputs(request)
            out = self.model.generate(**inputs, max_new_tokens=output_len, do_sample=False, streamer=timer)
        except Exception as exc:  # a failed request is a result, as over HTTP
            return RequestResult(request.index, False, started, e2e_s=time.perf_counter() - started,
                                 error=f"{type(exc).__name__}: {exc}")
        e2e = time.perf_counter() - started
        prompt_len = inputs["input_ids"].shape[1]
        ids = tuple(out[0, prompt_len:].tolist())
        tokens = len(ids)
        gaps = tuple(b - a for a, b in zip(timer.times, timer.times[1:], strict=False))
        ttft = timer.times[0] - started if timer.times else None
        # Decoded as the gateway and vLLM do by default (special tokens left out), for servers that
        # send text only.
        text = self.processor.tokenizer.decode(ids, skip_special_tokens=True)
        return RequestResult(request.index, tokens > 0, started, ttft, e2e, gaps, tokens, prompt_len,
                             error=None if tokens > 0 else "generate returned no tokens",
                             output_text=text, output_ids=ids)

    def run(self, requests: list[BenchRequest], output_len: int,
            on_done: Callable[[RequestResult], None] = lambda r: None) -> tuple[list[RequestResult], float]:
        """(results, wall time of the sequential run)."""
        started = time.perf_counter()
        results = []
        for request in requests:
            results.append(self.generate_one(request, output_len))
            on_done(results[-1])
        return results, time.perf_counter() - started

    def close(self) -> None:
        """Drop the weights before servers start, so they do not compete for memory with them."""
        del self.model, self.processor
