"""The decode worker's domain logic: pull a prefilled KV cache into the engine's blocks, then stream
the sequence's tokens as the running batch produces them, until EOS / stop ids / max_tokens, a
cancellation or the deadline.

Every sequence decoding here is in the engine's one running batch: a step samples a token for
all of them at once. `max_running` bounds the streams (each holds a gRPC thread), so health and
transfer calls always find a free thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from decode_svc.config import DecodeConfig
from epd.engine.loop import EngineLoop
from epd.engine.params import SamplingParams
from epd.engine.sequence import Finish
from epd.rpc_errors import InvalidInput, Overloaded
from epd.transfer.receiver import TransferReceiver

ROLE = "decode"
_POLL_S = 0.25  # how often a waiting stream checks that its client is still there


@dataclass(frozen=True)
class KvImport:
    handle: object  # common_pb2.TransferHandle
    metas: Sequence  # common_pb2.TensorMeta
    num_tokens: int
    position_delta: int


@dataclass(frozen=True)
class Step:
    token: int | None  # None on the admission step (the first) and on a "cancelled" step
    finish_reason: str | None  # "stop" / "length" / "cancelled" on the last step, else None
    completion_tokens: int  # tokens generated so far, the prefill's first one included


class DecodeService:
    def __init__(self, loop: EngineLoop, receiver: TransferReceiver, config: DecodeConfig) -> None:
        self.loop = loop
        self.engine = loop.engine
        self.receiver = receiver
        self.config = config
        self._lock = threading.Lock()
        self._active: set[str] = set()

    def warm_up(self) -> None:
        """A real prompt through the engine, its KV exported and imported back, and one decode step."""
        params = SamplingParams(max_tokens=2, ignore_eos=True)
        prompt = self.engine.new_sequence("warm-up-prompt", [0, 1, 2], params, handoff=True)
        out = self.loop.submit(prompt).get(self.config.decode_timeout_s)
        seq = self.engine.imported_sequence("warm-up", 3, out.token, 0, params)
        step = self.loop.submit(seq, kv=out.kv).get(self.config.decode_timeout_s)
        if step.finish is not Finish.LENGTH:
            raise RuntimeError(f"warm-up decode ended with {step.finish}")

    def cancel(self, request_id: str) -> bool:
        with self._lock:
            found = request_id in self._active
        if found:
            self.loop.abort(request_id)
        return found

    def decode(self, request_id: str, kv: KvImport, first_token: int, params: SamplingParams,
               stop_token_ids: Sequence[int], timeout_s: float, is_active: Callable[[], bool]) -> Iterator[Step]:
        self._admit(request_id)
        deadline = time.monotonic() + timeout_s
        submitted = False
        try:
            seq = self.engine.imported_sequence(request_id, kv.num_tokens, first_token, kv.position_delta,
                                                params, stop_token_ids)
            needed = self.engine.blocks.blocks_for(seq.max_total_tokens)
            if needed > self.engine.blocks.num_blocks - 1:
                raise InvalidInput(f"prompt + max_tokens = {seq.max_total_tokens} tokens need {needed} KV blocks; "
                                   f"this decode worker holds {self.engine.blocks.num_blocks - 1} in all")
            if needed > self.loop.free_blocks():  # before pulling KV we could not hold
                raise Overloaded(f"{self.loop.free_blocks()} KV blocks free, the request needs {needed}")
            tensors = self.receiver.fetch(kv.handle, kv.metas, kind="kv",
                                          timeout_s=min(timeout_s, self.config.pull_timeout_s))
            try:
                self.engine.cache.check_import(tensors, kv.num_tokens)
            except ValueError as exc:
                raise InvalidInput(str(exc)) from None
            stream = self.loop.submit(seq, kv=tensors)
            submitted = True
            stream.wait_admitted(max(deadline - time.monotonic(), 0.0))
            yield Step(None, None, seq.num_generated)  # admitted: the router may now send the first token
            yield from self._stream(stream, request_id, deadline, is_active)
        finally:
            if submitted and seq.finish is None:  # the caller stopped reading (gone, or an error): free it now
                self.loop.abort(request_id)
            self._leave(request_id)

    def _stream(self, stream, request_id: str, deadline: float, is_active: Callable[[], bool]) -> Iterator[Step]:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self.loop.abort(request_id)
                raise TimeoutError(f"deadline reached after {stream.seq.num_generated} tokens")
            if not is_active():  # the caller went away: free the blocks now, not at the last token
                self.loop.abort(request_id)
                yield Step(None, "cancelled", stream.seq.num_generated)
                return
            try:
                out = stream.get(min(left, _POLL_S))
            except TimeoutError:
                continue
            if out.finish is Finish.CANCELLED:
                yield Step(None, "cancelled", out.seq.num_generated)
                return
            finish = out.finish.value if out.finish is not None else None
            yield Step(out.token, finish, out.seq.num_generated)
            if finish:
                return

    def _admit(self, request_id: str) -> None:
        if not request_id:
            raise InvalidInput("request_id is empty; decode needs it for Cancel")
        with self._lock:
            if len(self._active) >= self.config.max_running:
                raise Overloaded(f"{len(self._active)} sequences already decoding; the limit is "
                                 f"{self.config.max_running}")
            if request_id in self._active:
                raise InvalidInput(f"request {request_id!r} is already decoding here")
            self._active.add(request_id)

    def _leave(self, request_id: str) -> None:
        with self._lock:
            self._active.discard(request_id)
