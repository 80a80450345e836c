"""Whether an engine runs our native CPU kernels (epd/kernels/) or torch's operators. Chosen once, at
engine start, and logged.

The kernels: the decode attention reading the KV pool in place (attention.pool_decode_attention,
instead of gathering every context and two products), the language model's RMSNorm in one call
(fused_norm.py), the MoE experts' weighted sum in one, a decode step's experts (epd.models.experts)
and, in float32, its dense layers (decode_linear.py); for an encoder, the vision tower's GELU
(fused_gelu.py). With them, float32 products of many rows (prompt steps, the vision tower) go to
oneDNN instead of MKL where oneDNN is there (onednn_linear.py, vision_attention.py). `auto` (the
default) takes them where they run (a CPU model of float32 or bfloat16) and build and pass their
self-check; `native` refuses to start without them; `torch`
never builds them. On a GPU the model stays with torch's kernels.
"""

from __future__ import annotations

import logging

import torch

from epd.kernels import MODES

log = logging.getLogger(__name__)

NATIVE_DTYPES = (torch.float32, torch.bfloat16)


def native_unsupported(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the native kernels cannot serve a model on `device` in `dtype`, or None; pure."""
    if device.type != "cpu":
        return f"the model is on {device.type}; the native kernels are CPU kernels"
    if dtype not in NATIVE_DTYPES:
        return f"the model is {dtype}; the native kernels take float32 or bfloat16"
    return None


ENGINE_KERNELS = "decode attention, RMSNorm, MoE combine and decode experts"
ENCODER_KERNELS = "vision GELU and attention softmax"


def engine_kernels(dtype: torch.dtype) -> str:
    """What an engine of `dtype` runs natively, for the log: float32 adds the dense decode products."""
    return ENGINE_KERNELS + (", decode linears" if dtype == torch.float32 else "")


def use_native_kernels(mode: str, device: torch.device, dtype: torch.dtype, kernels: str = ENGINE_KERNELS) -> bool:
    """True when the engine (or encoder: `kernels` names what is at stake, for the log) should run the
    native kernels; RuntimeError when `native` was asked for and cannot be had (no compiler, a failed
    self-check, a GPU), so the worker never becomes ready."""
    if mode not in MODES:
        raise ValueError(f"kernels must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "torch":
        return False
    reason = native_unsupported(device, dtype)
    if reason is None:
        from epd.kernels.native import load_kernels

        built = load_kernels()
        reason = None if built.ok else built.detail
    if reason is None:
        reason = self_check(dtype)
    if reason is None:
        log.info("kernels: native (%s; %s)", kernels, dtype)
        return True
    if mode == "native":
        raise RuntimeError(f"--kernels native: {reason}")
    log.warning("kernels: torch's (no native %s): %s", kernels, reason)
    return False


def self_check(dtype: torch.dtype) -> str | None:
    """Run each kernel once against its float32 reference (a miscompiled build must not serve);
    returns what went wrong, or None."""
    try:
        results = _self_check_results(dtype)
    except Exception as exc:  # a kernel that raises (a stale or foreign build) must not serve either
        return f"the built kernels raised in their self-check: {type(exc).__name__}: {str(exc).splitlines()[0]}"
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2  # relative to the reference's largest value (or 1)
    for name, (got, want) in results.items():
        error = (got.float() - want).abs().max().item() / max(want.abs().max().item(), 1.0)
        if not error <= tolerance:  # NaN fails too
            return f"the built {name} is off by {error:.3g} of its largest value (> {tolerance}) in its self-check"
    return None


def _self_check_results(dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each kernel's output on small random inputs beside its float32 reference's."""
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim_a, dim_b, dim_v, slots_total = 4, 2, 24, 8, 20, 128
    query = torch.randn(3, heads, dim_a + dim_b, generator=gen).to(dtype)
    key_a, key_b, value = (torch.randn(kv_heads, slots_total, width, generator=gen).to(dtype)
                           for width in (dim_a, dim_b, dim_v))
    slots = torch.randperm(slots_total, generator=gen)[:3 * 40].view(3, 40).contiguous()  # [3, 40]
    lengths = torch.tensor([40, 1, 23])
    rows, weight = torch.randn(5, 40, generator=gen).to(dtype), (torch.rand(40, generator=gen) + 0.5).to(dtype)
    index, routing = torch.randint(0, 4, (3, 2), generator=gen), torch.rand(3, 2, generator=gen).to(dtype)  # [3, 2]
    results = {
        "paged_decode": (torch.ops.epd.paged_decode(query, key_a, key_b, value, slots, lengths, 0.2),
                         reference_paged_decode(query, key_a, key_b, value, slots, lengths, 0.2)),
        "rms_norm": (torch.ops.epd.rms_norm(rows, weight, 1e-6), reference_rms_norm(rows, weight, 1e-6)),
        "moe_combine": (torch.ops.epd.moe_combine(rows, index, routing),
                        reference_moe_combine(rows, index, routing)),
    }
    hidden = torch.randn(3, 32, generator=gen).to(dtype)  # [T, H]
    gate_up, down = (torch.randn(4, *shape, generator=gen).mul(0.3).to(dtype) for shape in ((32, 32), (32, 16)))
    results["moe_decode"] = (torch.ops.epd.moe_decode(hidden, index, routing, gate_up, down),
                             reference_moe_decode(hidden, index, routing, gate_up, down))
    activations = torch.linspace(-12, 12, 203).to(dtype)  # both tails, and a remainder past the last vector
    results["gelu_tanh"] = (torch.ops.epd.gelu_tanh(activations),
                            torch.nn.functional.gelu(activations.float(), approximate="tanh"))
    if dtype == torch.float32:  # the dense decode product is float32's only (epd.engine.decode_linear)
        weight = torch.randn(37, 32, generator=gen)  # [N, K]: a remainder of every block it computes
        results["linear_decode"] = (torch.ops.epd.linear_decode(hidden, weight), hidden @ weight.T)
        # the vision attention's softmax (float32's only, epd.engine.vision_attention): 3 padded columns
        scores = torch.randn(5, 40, generator=gen) * 4
        results["softmax_rows_"] = (torch.ops.epd.softmax_rows_(scores.clone(), 37),
                                    torch.nn.functional.pad(torch.softmax(scores[:, :37], dim=-1), (0, 3)))
    return results


def reference_paged_decode(query: torch.Tensor, key_a: torch.Tensor, key_b: torch.Tensor | None,
                           value: torch.Tensor, slots: torch.Tensor, lengths: torch.Tensor,
                           scale: float) -> torch.Tensor:
    """What torch.ops.epd.paged_decode computes, one sequence at a time in float32 (for checks, not speed).

    query [n, Hq, Da + Db]; key_a [Hk, S, Da]; key_b [Hk, S, Db] or None; value [Hk, S, Dv];
    slots [n, L]; lengths [n] -> [n, Hq, Dv] float32.
    """
    keys = key_a if key_b is None else torch.cat([key_a, key_b], dim=-1)  # [Hk, S, Dq]
    group = query.shape[1] // keys.shape[0]
    rows = []
    for i in range(query.shape[0]):
        context = slots[i, :int(lengths[i])]
        k = keys[:, context].float().repeat_interleave(group, dim=0)  # [Hq, len, Dq]
        v = value[:, context].float().repeat_interleave(group, dim=0)  # [Hq, len, Dv]
        probs = torch.softmax(torch.einsum("hd,hld->hl", query[i].float(), k) * scale, dim=-1)  # [Hq, len]
        rows.append(torch.einsum("hl,hld->hd", probs, v))
    return torch.stack(rows)


def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm forward (Qwen3-VL-MoE, DeepSeek-V3), as float32: x [..., D], weight [D]."""
    normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
    return (weight * normed.to(x.dtype)).float()


def reference_moe_combine(rows: torch.Tensor, index: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """What torch.ops.epd.moe_combine computes, as float32: rows [R, H], index / weights [T, k] -> [T, H]."""
    return (rows.float()[index] * weights.float().unsqueeze(-1)).sum(dim=1)


def reference_moe_decode(hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor,
                         down: torch.Tensor) -> torch.Tensor:
    """What torch.ops.epd.moe_decode computes, as float32: hidden [T, H], index / weights [T, k],
    gate_up [E, 2I, H], down [E, H, I] -> [T, H]."""
    rows = hidden.float()[:, None, None]  # [T, 1, 1, H]
    gate, up = (rows @ gate_up.float()[index].transpose(-1, -2)).chunk(2, dim=-1)  # [T, k, 1, I] each
    out = (torch.nn.functional.silu(gate) * up) @ down.float()[index].transpose(-1, -2)  # [T, k, 1, H]
    return (out.squeeze(2) * weights.float().unsqueeze(-1)).sum(dim=1)
