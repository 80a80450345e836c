"""The engine: schedule -> execute -> update, one step at a time, over a paged KV pool.

Prefill workers, decode workers, the colocated worker and the in-process path all run this same
object in different roles: a prefill worker adds prompts with `handoff=True` and ships each
finished prompt's blocks; a decode worker admits sequences whose KV it imported; the others run
sequences from prompt to last token. Not thread-safe: `EngineLoop` owns it on one thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import torch

from epd import metrics
from epd.engine import attention, decode_linear, fused_norm, last_layer, mla, onednn_linear, ungrouped_router
from epd.engine.block_manager import BlockManager
from epd.engine.direct_decode import DirectDecode, NotDirect
from epd.engine.encode import EncodedImage
from epd.engine.model_runner import ModelRunner, SequenceInputs
from epd.engine.native_kernels import engine_kernels, use_native_kernels
from epd.engine.paged_cache import NamedTensors, PagedKVCache, bytes_per_block, probe_layer_shapes
from epd.engine.params import SamplingParams
from epd.engine.positions import PositionPlan
from epd.engine.sampling import Sampler
from epd.engine.scheduler import Scheduler, SchedulerConfig
from epd.engine.sequence import Finish, ImageSpan, Sequence, stop_ids
from epd.kernels import MODES as KERNEL_MODES
from epd.models import experts, shape_buckets
from epd.models.loading import LanguageModel
from epd.threads import set_thread_compute

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 16
    kv_cache_bytes: int = 1 << 30  # the KV pool's budget; ignored when num_blocks is set
    num_blocks: int | None = None
    enable_prefix_cache: bool = True
    absorb_latent_attention: bool = True  # MLA families: attention over the cached latents (see mla.py)
    kernels: str = "auto"  # auto | native | torch: our C++ kernels or torch's (epd.engine.native_kernels)
    direct_decode: bool = True  # decode-only steps through epd.engine.direct_decode, where it applies
    sampled_rows_only: bool = True  # prompt steps' last layer only for the sampled rows (epd.engine.last_layer)
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.kernels not in KERNEL_MODES:
            raise ValueError(f"kernels must be one of {', '.join(KERNEL_MODES)}, got {self.kernels!r}")
        if self.num_blocks is not None and self.num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2, got {self.num_blocks}")
        if self.num_blocks is None and self.kv_cache_bytes < 1:
            raise ValueError(f"kv_cache_bytes must be >= 1, got {self.kv_cache_bytes}")


@dataclass(frozen=True)
class StepOutput:
    seq: Sequence
    token: int
    finish: Finish | None
    kv: NamedTensors | None = None  # the prompt's blocks, on a HANDOFF finish


class Engine:
    def __init__(self, language: LanguageModel, config: EngineConfig, eos_token_ids: Iterable[int],
                 role: str = "engine") -> None:
        self.language = language
        self.config = config
        self.role = role
        self.eos_token_ids = tuple(eos_token_ids)
        text = language.config.get_text_config()
        self.vocab_size = int(text.vocab_size)
        self.max_model_len = config.max_model_len or int(getattr(text, "max_position_embeddings", 1 << 20))
        shapes = probe_layer_shapes(language.model, self._probe_inputs())
        dtype = next(language.model.parameters()).dtype
        num_blocks = config.num_blocks or config.kv_cache_bytes // bytes_per_block(shapes, config.block_size, dtype)
        if num_blocks < 2:
            raise ValueError(f"a KV budget of {config.kv_cache_bytes} bytes holds {num_blocks} blocks of "
                             f"{config.block_size} tokens; at least 2 are needed")
        language.model.set_attn_implementation({"text_config": attention.register()})
        shape_buckets.install(language.model)  # prompt steps' row counts, for per-shape kernel builds
        ungrouped_router.install(language.model)  # bit for bit the library's routing, fewer operators
        self.cache = PagedKVCache(shapes, num_blocks, config.block_size, dtype=dtype,
                                  device=next(language.model.parameters()).device)
        self.blocks = BlockManager(num_blocks, config.block_size, config.enable_prefix_cache)
        self.scheduler = Scheduler(config.scheduler, self.blocks)
        # built on a machine's first start
        native = use_native_kernels(config.kernels, self.cache.device, dtype, engine_kernels(dtype))
        if language.adapter.latent_attention and config.absorb_latent_attention:
            mla.install(language.model, native)
        if native:
            fused_norm.install(language.model)
            onednn = onednn_linear.available(dtype)  # many rows' float32 products
            decode_linear.install(language.model, onednn)
            experts.install_native(language.model, onednn)
        self.runner = ModelRunner(language, self.cache, decode_in_place=native)
        self.runner.direct = self._direct_decode(native)
        # After the direct forward is built: it reads the layers' own forwards, which this wraps.
        if config.sampled_rows_only:
            self.runner.sampled_only_layer = last_layer.install_last(language.model)
        # OpenMP threads per step, by its tokens and its largest prompt chunk (epd.threads.StepThreads)
        self.step_threads: Callable[[int, int], int] | None = None
        self._preemptions_seen = 0
        metrics.KV_BLOCKS_TOTAL.labels(role).set(num_blocks - 1)
        log.info("%s engine: %d KV blocks of %d tokens (%.1f MiB)", role, num_blocks - 1, config.block_size,
                 num_blocks * bytes_per_block(shapes, config.block_size, dtype) / 2**20)

    # --- building sequences ---------------------------------------------------------------------

    def new_sequence(self, request_id: str, token_ids: list[int], params: SamplingParams,
                     images: Seq[EncodedImage] = (), image_starts: Seq[int] = (),
                     digests: Seq[str] | None = None, extra_stop_ids: Iterable[int] = (),
                     handoff: bool = False) -> Sequence:
        """A prompt (placeholders already expanded) to prefill here; `digests` enable prefix reuse
        across requests for prompts with images (without them such prompts are never shared)."""
        spans = [(s, im.grid_thw) for s, im in zip(image_starts, images, strict=True)]
        plan = self.language.adapter.plan_positions(self.language.config, token_ids, spans)
        names = list(digests) if digests is not None else [""] * len(images)
        return Sequence(
            request_id=request_id, token_ids=list(token_ids), num_prompt_tokens=len(token_ids), params=params,
            stop_token_ids=stop_ids(params, self.eos_token_ids, extra_stop_ids),
            images=tuple(ImageSpan(s, im.num_tokens, d) for s, im, d in zip(image_starts, images, names, strict=True)),
            max_model_len=self.max_model_len, handoff=handoff, cacheable=digests is not None or not images,
            inputs=SequenceInputs(plan, [im.tensors for im in images], Sampler(params)))

    def imported_sequence(self, request_id: str, num_prompt_tokens: int, first_token: int, position_delta: int,
                          params: SamplingParams, extra_stop_ids: Iterable[int] = ()) -> Sequence:
        """A sequence whose prompt KV arrives from a prefill worker; `first_token` is fed next."""
        empty = self.language.adapter.plan_positions(self.language.config, [], [])
        plan = PositionPlan(prefill=empty.prefill, delta=position_delta)
        # The prompt's ids stay on the prefill worker; placeholders keep indices and lengths right.
        seq = Sequence(request_id=request_id, token_ids=[0] * num_prompt_tokens + [first_token],
                       num_prompt_tokens=num_prompt_tokens, params=params,
                       stop_token_ids=stop_ids(params, self.eos_token_ids, extra_stop_ids),
                       max_model_len=self.max_model_len, recomputable=False, cacheable=False,
                       inputs=SequenceInputs(plan, [], Sampler(params)))
        seq.num_computed_tokens = num_prompt_tokens
        return seq

    # --- driving --------------------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        self.scheduler.add(seq)

    def admit_imported(self, seq: Sequence, kv: NamedTensors) -> bool:
        """Take blocks for an imported sequence and fill them; False (nothing held) if the pool is full."""
        self.cache.check_import(kv, seq.num_prompt_tokens)
        if not self.scheduler.admit_now(seq):
            return False
        self.runner.import_prompt(seq, kv)
        self._publish_gauges()
        return True

    def abort(self, seq: Sequence) -> None:
        self.scheduler.finish(seq, Finish.CANCELLED)
        self._publish_gauges()

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @property
    def decode_only(self) -> bool:
        """No prompt waits or is part-way through its prefill: the next step only decodes."""
        return not self.scheduler.waiting and not any(s.is_prefilling for s in self.scheduler.running)

    def step(self) -> list[StepOutput]:
        """One forward over what the scheduler picks; returns each sequence's new token (if any)."""
        started = time.perf_counter()
        out = self.scheduler.schedule()
        if not out.scheduled:
            return []
        if self.step_threads is not None:
            set_thread_compute(self.step_threads(out.num_tokens, out.largest_chunk))
        sampled = self.runner.execute(out.scheduled)
        outputs = []
        for seq, token, finish in self.scheduler.update(out, sampled):
            kv = None
            if finish is not None:
                kv = self.runner.export_prompt(seq) if finish is Finish.HANDOFF else None
                self.scheduler.finish(seq)
            outputs.append(StepOutput(seq, token, finish, kv))
        metrics.BATCH_SIZE.labels(self.role).observe(len(out.scheduled))
        metrics.STEP_SECONDS.labels(self.role, out.kind).observe(time.perf_counter() - started)
        self._publish_gauges()
        return outputs

    def fail_running(self, exc: BaseException) -> list[Sequence]:
        """Drop the running sequences (after a failed forward); returns them so their callers can be told."""
        dropped = list(self.scheduler.running)
        for seq in dropped:
            self.scheduler.finish(seq, Finish.CANCELLED)
        log.error("%s engine: a step failed, %d sequences dropped: %s", self.role, len(dropped), exc)
        self._publish_gauges()
        return dropped

    def run_to_completion(self, seqs: list[Sequence]) -> list[StepOutput]:
        """Add and step until every given sequence has finished (the in-process path and tests)."""
        for seq in seqs:
            self.add(seq)
        outputs = []
        while any(s.finish is None for s in seqs):
            if not self.scheduler.running and not self.scheduler.schedule_would_admit():
                raise RuntimeError("sequences wait for KV blocks that no running sequence will free")
            outputs.extend(self.step())
        return outputs

    def _direct_decode(self, native: bool) -> DirectDecode | None:
        """The direct decode forward where the config asks for it and the model allows it; logged."""
        if not self.config.direct_decode:
            reason = "--decode-forward module"
        elif not native:
            reason = "it needs the native kernels"
        else:
            try:
                direct = DirectDecode.build(self.language.model)
                log.info("%s engine: decode steps through the direct forward", self.role)
                return direct
            except NotDirect as exc:
                reason = str(exc)
        log.info("%s engine: decode steps through the modules (%s)", self.role, reason)
        return None

    def _publish_gauges(self) -> None:
        metrics.KV_BLOCKS_USED.labels(self.role).set(self.blocks.num_used_blocks)
        new = self.scheduler.num_preemptions - self._preemptions_seen
        if new:
            metrics.PREEMPTIONS.labels(self.role).inc(new)
            self._preemptions_seen = self.scheduler.num_preemptions

    def _probe_inputs(self) -> dict:
        plan = self.language.adapter.plan_positions(self.language.config, [0, 1], [])
        positions = plan.prefill.unsqueeze(0) if plan.prefill.ndim == 1 else plan.prefill.unsqueeze(1)
        return {"input_ids": torch.tensor([[0, 1]]), "position_ids": positions}
