"""`epd bench decode`: the engine's decode step at a fixed batch, beside the memory-bandwidth bound.

A decode step must at least read every weight it uses once: the dense layers, the LM head, and
the experts that the batch's tokens were routed to (counted per step by hooks on the expert
modules). Dividing those bytes by the machine's read bandwidth, measured in the same run, gives
the fastest a step could be; the figure printed is measured tokens/s as a fraction of that bound.
`--profile` adds where a step's time goes: by part of the model (epd.bench.step_parts) and by
operator (torch profiler).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass

import torch

_PROFILED_STEPS = 5
# Tokens each sequence may make beyond the measured steps: up to 8 while warming up, then the profiled
# steps (the hooked ones and one under torch's profiler).
_SPARE_TOKENS = 8 + _PROFILED_STEPS + 1


@dataclass(frozen=True)
class DecodeBench:
    batch: int
    context: int
    step_ms: float  # median over the measured steps
    tokens_per_s: float
    weight_bytes_per_step: float  # dense + LM head + routed experts actually hit (mean per step)
    kv_bytes_per_step: float  # cached keys/values the attention reads
    read_gb_per_s: float  # this machine, measured now: a full read of a buffer far larger than caches
    bound_tokens_per_s: float  # batch / (weight bytes / read bandwidth)
    forward: str = "modules"  # how the steps ran: "direct" (epd.engine.direct_decode) or through the modules

    @property
    def fraction_of_bound(self) -> float:
        return self.tokens_per_s / self.bound_tokens_per_s

    def to_dict(self) -> dict:
        return {**asdict(self), "fraction_of_bound": self.fraction_of_bound}


def read_bandwidth_gb_per_s(size_mb: int = 1024, repeats: int = 5, device: torch.device | str = "cpu") -> float:
    """Best of `repeats` full reads (a sum) of a `size_mb` buffer on `device` (HBM on a GPU), in GB/s."""
    device = torch.device(device)
    buffer = torch.ones(size_mb << 18, dtype=torch.float32, device=device)  # size_mb MiB
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        started = time.perf_counter()
        buffer.sum()
        _sync(device)
        best = min(best, time.perf_counter() - started)
    return buffer.numel() * 4 / best / 1e9


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class ExpertCounter:
    """Counts, per step, the distinct experts each MoE layer ran (forward pre-hooks on the expert modules,
    which the direct decode forward calls too)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.hit: dict[int, set[int]] = {}
        self.expert_bytes: dict[int, int] = {}
        self._hooks = []
        for module in model.modules():
            weights = [p for name, p in module.named_parameters(recurse=False) if name in ("gate_up_proj", "down_proj")]
            if len(weights) == 2 and weights[0].ndim == 3:  # fused experts: [E, out, in] per projection
                key = id(module)
                self.expert_bytes[key] = sum(w[0].numel() * w.element_size() for w in weights)
                self._hooks.append(module.register_forward_pre_hook(self._record(key)))

    def _record(self, key: int):
        def hook(module, args):
            top_k_index = args[1]  # forward(hidden_states, top_k_index, top_k_weights)
            self.hit.setdefault(key, set()).update(top_k_index.flatten().tolist())
        return hook

    def take(self) -> int:
        """Bytes of the experts hit since the last take."""
        total = sum(len(experts) * self.expert_bytes[key] for key, experts in self.hit.items())
        self.hit = {}
        return total

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()


def dense_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every weight a decode step reads whole: all but the experts and the embedding table."""
    skip = set()
    for module in model.modules():
        if isinstance(module, torch.nn.Embedding):
            skip.update(id(p) for p in module.parameters(recurse=False))
        for name, p in module.named_parameters(recurse=False):
            if name in ("gate_up_proj", "down_proj") and p.ndim == 3:
                skip.add(id(p))
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen and id(p) not in skip:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    # A tied LM head shares the embedding table, and a step does read all of it.
    head = getattr(model, "lm_head", None)
    if head is not None and id(head.weight) in skip:
        total += head.weight.numel() * head.weight.element_size()
    return total


def run_decode_bench(model_dir: str, batch: int, context: int = 256, steps: int = 20, dtype: str = "auto",
                     profile: bool = False, device: str = "cpu",
                     read_gb_per_s: float | None = None,
                     kernels: str = "auto", direct_decode: bool = True) -> tuple[DecodeBench, str | None]:
    """Prefill `batch` prompts of `context` tokens, then time `steps` decode steps of the whole batch.

    `read_gb_per_s`: the device's read bandwidth if the caller measured it already (else measured here)."""
    from epd.devices import resolve_device, use_device
    from epd.dtypes import resolve_dtype
    from epd.engine.engine import Engine, EngineConfig
    from epd.engine.params import SamplingParams
    from epd.engine.pipeline import eos_token_ids
    from epd.models.loading import load_language_model

    where = use_device(resolve_device(device))
    language = load_language_model(model_dir, resolve_dtype(dtype, where), where)
    vocab = int(language.config.get_text_config().vocab_size)
    tokens = batch * (context + steps + _SPARE_TOKENS)
    engine = Engine(language, EngineConfig(kv_cache_bytes=1 << 40, num_blocks=tokens // 16 + batch + 2,
                                           kernels=kernels, direct_decode=direct_decode),
                    eos_token_ids(language.model_dir, language.config), role="bench")
    params = SamplingParams(max_tokens=steps + _SPARE_TOKENS, ignore_eos=True)
    seqs = [engine.new_sequence(f"bench-{i}", [(37 * i + 11 * j) % (vocab - 1) + 1 for j in range(context)],
                                params) for i in range(batch)]
    for seq in seqs:
        engine.add(seq)
    while any(seq.num_generated < 2 for seq in seqs):  # prefill, then one decode step to warm up
        engine.step()
    counter = ExpertCounter(language.model)
    times, expert_bytes = [], []
    for _ in range(steps):
        counter.take()
        started = time.perf_counter()
        engine.step()  # sampling reads the tokens back to the host: the step has finished on the device
        times.append(time.perf_counter() - started)
        expert_bytes.append(counter.take())
    counter.close()
    table = _profile_step(engine, language.model, batch) if profile else None
    step_s = statistics.median(times)
    weights = dense_weight_bytes(language.model) + statistics.mean(expert_bytes)
    per_token_kv = sum(s.heads * (s.key_dim + s.value_dim) for s in engine.cache.shapes) * \
        engine.cache.keys[0].element_size()
    kv = per_token_kv * sum(seq.num_tokens for seq in seqs)
    bandwidth = read_gb_per_s or read_bandwidth_gb_per_s(device=where)
    bound = batch / (weights / (bandwidth * 1e9))
    forward = "modules" if engine.runner.direct is None else "direct"
    return DecodeBench(batch, context, step_s * 1000, batch / step_s, weights, kv, bandwidth, bound, forward), table


def _profile_step(engine, model: torch.nn.Module, batch: int) -> str:
    """By part of the model over a few hooked steps, then one step by operator (torch profiler)."""
    from torch.profiler import ProfilerActivity, profile

    from epd.bench.step_parts import format_parts, time_parts
    from epd.engine import attention

    # The native decode attention is a function, not a module: timed under self_attn, as the cache's update
    # (both its callers, GQA's paged_attention and MLA's, call it through the attention module).
    calls = [(engine.cache, "update", "KV cache: write, gather"),
             (attention, "pool_decode_attention", "decode attention, in place")]
    # Parts are timed by hooks on the modules, which the direct decode forward does not call: those
    # steps go through the modules (the operator table below times the step as it runs).
    direct, engine.runner.direct = engine.runner.direct, None
    try:
        parts = format_parts(time_parts(model, engine.step, steps=_PROFILED_STEPS, calls=calls), batch,
                             always=[label for _, _, label in calls])
    finally:
        engine.runner.direct = direct
    if direct is not None:
        parts += "\n  (those steps ran through the modules; the measured steps and the one below, the direct forward)"
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.step()
    return parts + "\n\none step by operator:\n" + prof.key_averages().table(sort_by="self_cpu_time_total",
                                                                              row_limit=20)


def format_decode(result: DecodeBench) -> str:
    r = result
    return "\n".join([
        f"decode at batch {r.batch}, context {r.context} ({r.forward} forward): {r.step_ms:.1f} ms per step, "
        f"{r.tokens_per_s:.0f} tokens/s",
        f"  weights read per step: {r.weight_bytes_per_step / 2**20:.1f} MiB (dense + LM head + experts hit); "
        f"KV read: {r.kv_bytes_per_step / 2**20:.1f} MiB",
        f"  read bandwidth (measured now): {r.read_gb_per_s:.1f} GB/s -> bound {r.bound_tokens_per_s:.0f} tokens/s",
        f"  measured / bound: {r.fraction_of_bound:.2f}",
    ])
