"""The decode worker's domain logic: import a prefilled KV cache, continue generation token by
token, stop on EOS / stop ids / max_tokens, on cancellation or on the deadline.

Sequences take turns on the model one step at a time (ModelGate), so concurrent streams progress
together. Batching many sequences into one forward is the engine's job and not done here yet.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from decode_svc.config import DecodeConfig
from epd import metrics
from epd.engine.kv import import_kv
from epd.engine.language import LanguageRunner
from epd.engine.sampling import Sampler, SamplingParams
from epd.model_gate import ModelGate
from epd.rpc_errors import InvalidInput, Overloaded
from epd.transfer.receiver import TransferReceiver

ROLE = "decode"


@dataclass(frozen=True)
class KvImport:
    handle: object  # common_pb2.TransferHandle
    metas: Sequence  # common_pb2.TensorMeta
    num_tokens: int
    position_delta: int


@dataclass(frozen=True)
class Step:
    token: int | None  # None only on a "cancelled" step, which carries no token
    finish_reason: str | None  # "stop" / "length" / "cancelled" on the last step, else None
    completion_tokens: int  # tokens generated so far, the prefill's first one included


class DecodeService:
    def __init__(self, runner: LanguageRunner, receiver: TransferReceiver, eos_token_ids: Sequence[int],
                 config: DecodeConfig) -> None:
        self.runner = runner
        self.receiver = receiver
        self.eos_token_ids = tuple(eos_token_ids)
        self.config = config
        self.gate = ModelGate(ROLE, max_waiting=config.max_running)
        self._lock = threading.Lock()
        self._running: dict[str, threading.Event] = {}  # request id -> cancelled flag

    def warm_up(self) -> None:
        """A real prefill + decode step over a short text prompt."""
        _, state = self.runner.prefill([0, 1, 2], [], [])
        self.runner.decode_step(state, 3)

    def cancel(self, request_id: str) -> bool:
        with self._lock:
            flag = self._running.get(request_id)
        if flag is not None:
            flag.set()
        return flag is not None

    def decode(self, request_id: str, kv: KvImport, first_token: int, params: SamplingParams,
               stop_token_ids: Sequence[int], timeout_s: float, is_active: Callable[[], bool]) -> Iterator[Step]:
        cancelled = self._admit(request_id)
        deadline = time.monotonic() + timeout_s
        try:
            tensors = self.receiver.fetch(kv.handle, kv.metas, kind="kv",
                                          timeout_s=min(timeout_s, self.config.pull_timeout_s))
            cache, length = import_kv(tensors, self.runner.language.config)
            if length != kv.num_tokens:
                raise InvalidInput(f"KV holds {length} tokens, the reference says {kv.num_tokens}")
            state = self.runner.resume(cache, length, kv.position_delta)
            yield from self._loop(state, first_token, params, stop_token_ids, deadline,
                                  lambda: cancelled.is_set() or not is_active())
        finally:
            self._leave(request_id)

    def _loop(self, state, token: int, params: SamplingParams, stop_token_ids, deadline: float,
              is_cancelled: Callable[[], bool]) -> Iterator[Step]:
        sampler = Sampler(params)
        stops = set(stop_token_ids) | (set() if params.ignore_eos else set(self.eos_token_ids))
        count = 1  # the prefill worker produced the first token
        while True:
            if is_cancelled():
                yield Step(None, "cancelled", count)
                return
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"deadline reached after {count} tokens")
            with self.gate.turn(min(left, self.config.step_wait_s)):
                logits = self.runner.decode_step(state, token)
            token = sampler(logits)
            count += 1
            finish = "stop" if token in stops else "length" if count >= params.max_tokens else None
            yield Step(token, finish, count)
            if finish:
                return

    def _admit(self, request_id: str) -> threading.Event:
        if not request_id:
            raise InvalidInput("request_id is empty; decode needs it for Cancel")
        with self._lock:
            if len(self._running) >= self.config.max_running:
                raise Overloaded(f"{len(self._running)} sequences already decoding; the limit is "
                                 f"{self.config.max_running}")
            if request_id in self._running:
                raise InvalidInput(f"request {request_id!r} is already decoding here")
            flag = self._running[request_id] = threading.Event()
            metrics.RUNNING.labels(ROLE).set(len(self._running))
        return flag

    def _leave(self, request_id: str) -> None:
        with self._lock:
            self._running.pop(request_id, None)
            metrics.RUNNING.labels(ROLE).set(len(self._running))
