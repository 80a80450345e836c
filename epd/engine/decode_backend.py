"""Which decode attention a worker runs: the native kernel reading the block pool in place, or torch's
gather + matmuls (attention.decode_attention). Chosen once, at engine start, and logged.

`auto` (the default) takes the native kernel where it runs (a CPU pool of float32 or bfloat16)
and builds and passes its self-check; `native` refuses to start without it; `torch` never uses it.
On a GPU the pool stays with torch's kernels.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

MODES = ("auto", "native", "torch")
NATIVE_DTYPES = (torch.float32, torch.bfloat16)


def native_unsupported(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the native kernel cannot serve a pool on `device` of `dtype`, or None; pure."""
    if device.type != "cpu":
        return f"the KV pool is on {device.type}; the native decode attention is a CPU kernel"
    if dtype not in NATIVE_DTYPES:
        return f"the KV pool is {dtype}; the native decode attention takes float32 or bfloat16"
    return None


def reads_pool_in_place(mode: str, device: torch.device, dtype: torch.dtype) -> bool:
    """True when decodes should run the native kernel; RuntimeError when `native` was asked for and
    cannot be had (no compiler, a failed self-check, a GPU pool), so the worker never becomes ready."""
    if mode not in MODES:
        raise ValueError(f"decode attention must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "torch":
        return False
    reason = native_unsupported(device, dtype)
    if reason is None:
        from epd.kernels.native import load_paged_decode

        built = load_paged_decode()
        reason = None if built.ok else built.detail
    if reason is None:
        reason = self_check(dtype)
    if reason is None:
        log.info("decode attention: native, reading the KV pool in place (%s)", dtype)
        return True
    if mode == "native":
        raise RuntimeError(f"--decode-attention native: {reason}")
    log.warning("decode attention: torch (gather + matmuls): %s", reason)
    return False


def self_check(dtype: torch.dtype) -> str | None:
    """Run the kernel once against `reference_paged_decode` (a miscompiled build must not serve);
    returns what went wrong, or None."""
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim_a, dim_b, dim_v, slots_total = 4, 2, 24, 8, 20, 128
    query = torch.randn(3, heads, dim_a + dim_b, generator=gen).to(dtype)
    key_a, key_b, value = (torch.randn(kv_heads, slots_total, width, generator=gen).to(dtype)
                           for width in (dim_a, dim_b, dim_v))
    slots = torch.randperm(slots_total, generator=gen)[:3 * 40].view(3, 40).contiguous()  # [3, 40]
    lengths = torch.tensor([40, 1, 23])
    got = torch.ops.epd.paged_decode(query, key_a, key_b, value, slots, lengths, 0.2).float()
    want = reference_paged_decode(query, key_a, key_b, value, slots, lengths, 0.2)
    error = (got - want).abs().max().item()
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    return None if error <= tolerance else f"the built kernel is off by {error:.3g} (> {tolerance}) in its self-check"


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
