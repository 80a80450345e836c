"""float32 products of many rows through oneDNN instead of MKL: the vision tower, prompt steps
(dense layers and each expert's rows); a decode-only step's products stay with MKL (`decode_step`).

torch sends a float32 `F.linear` to MKL, and MKL, on a CPU not made by Intel, runs its AVX2 code
even where the CPU has AVX-512. On an AVX-512 Zen 5 (2 vCPUs, one thread) MKL's float32 products
ran at 108-118 GFLOP/s and oneDNN's (`torch.ops.mkldnn._linear_pointwise`, the op inductor's CPU
backend calls, here with the plain [out, in] weight: no packed copy) at 220-275, for every shape a
small checkpoint's vision tower and prompt step have (84-1024 rows, 128-1536 wide; /tmp/s35/gemm3.py).
`generate` keeps MKL, so this is time the baseline spends and we need not.

Bits: oneDNN adds in another order than MKL, so an output differs from the library's by a few units
in float32's last place (2e-5 of 16 in a Kimi vision tower's output), as the native decode products
already do. Each row's result is independent of how many rows go with it (checked for 2-1100 rows,
one and two threads) except at one row, where oneDNN takes another kernel: a lone row is padded to
two, so a prompt's token gets the same bits alone, chunked or batched with other prompts.

oneDNN builds (JIT-compiles) a kernel per shape it meets (0.15-0.35 ms each, /tmp/s35/jit.py) and
keeps memory for every shape it has met: 3000 products of random row counts up to 1200 grew a
process by 800 MiB and on (with the primitive cache at 32 entries too), the same products in
buckets not at all (/tmp/s35/mem.py). So row counts are always rounded up: a prompt step's past 16
(each expert's too) to `bucket_rows`' few sizes (at most 1/8 more rows, zeros), so its varying
lengths also meet kernels already built; an encoder's, one per image size, to finer buckets (1/64
of a power of two: 784 and 1024 patches stay as they are), and its attention pads the keys alike.
"""

from __future__ import annotations

import functools
import logging
import platform
from contextlib import AbstractContextManager

import torch
import torch.nn.functional as F

from epd.models.rerouting import reroute
from epd.models.shape_buckets import bucket_rows, padded_product
from epd.thread_setting import ThreadSetting

log = logging.getLogger(__name__)

X86 = ("x86_64", "amd64")


FINE_BITS = 6  # an encoder's row buckets: 1/64 of a power of two (784 and 1024 patches exact)


def padded_rows(rows: int, fine: bool = False) -> int:
    """The row count a product of `rows` rows is computed at: at least 2, past 16 `bucket_rows`
    (`fine`: its finer buckets, past 64); pure."""
    return max(2, bucket_rows(rows, FINE_BITS) if fine else bucket_rows(rows))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           fine: bool = False) -> torch.Tensor:
    """x [..., K] @ weight [N, K]^T (+ bias [N]) -> [..., N], float32 on a CPU, through oneDNN.
    `fine` for an encoder's row counts (one per image size: finer buckets cost less padding)."""
    if not weight.is_contiguous() and not weight.t().is_contiguous():
        # Rows of another tensor (a head's keys in [n, H, d]): oneDNN takes such strides through a
        # reference kernel, 470 ms instead of 0.6 for a 1024-patch head's scores.
        weight = weight.contiguous()
    return padded_product(x, lambda rows: padded_rows(rows, fine),
                          lambda flat: torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "none", [], ""))


_decoding: ThreadSetting[bool] = ThreadSetting(False)


def decode_step(active: bool) -> AbstractContextManager[None]:
    """Marks the calling thread's forward as a decode-only step (`active`), whose products past the
    native kernels' rows stay with MKL as they did before oneDNN took prompt products: a CI run of 64
    concurrent tiny-model streams once parted from `generate` at a decode token with them in oneDNN."""
    return _decoding.set(active)


def decoding() -> bool:
    """Whether the calling thread is inside a decode-only step (`decode_step(True)`)."""
    return _decoding.get()


def encoder_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`linear` in the encoder's fine row buckets, called as F.linear."""
    return linear(x, weight, bias, fine=True)


def linear_forward(self, x: torch.Tensor) -> torch.Tensor:
    """nn.Linear's forward through `linear`, in the encoder's fine row buckets."""
    return encoder_linear(x, self.weight, self.bias)


def takes(module: torch.nn.Module) -> bool:
    """A float32 nn.Linear on a CPU; pure."""
    return (type(module) is torch.nn.Linear and module.weight.dtype == torch.float32
            and module.weight.device.type == "cpu")


def install(model: torch.nn.Module) -> int:
    """Route every linear of `model` that `takes` through `linear`; returns how many."""
    return reroute(model, takes, linear_forward)


def unavailable() -> str | None:
    """Why oneDNN cannot take float32 products here, or None (checked once against `F.linear`)."""
    if platform.machine().lower() not in X86:
        return f"oneDNN's float32 products are used on x86 CPUs only (this is {platform.machine()})"
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return "this torch build has no oneDNN (mkldnn) linear"
    generator = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(48, 64, generator=generator), torch.randn(48, generator=generator)
    for rows in (1, 3, 37):
        x = torch.randn(rows, 64, generator=generator)
        try:
            got = linear(x, weight, bias)
        except RuntimeError as exc:
            return f"oneDNN's linear raised: {str(exc).splitlines()[0]}"
        error = (got - F.linear(x, weight, bias)).abs().max().item()
        if not error <= 1e-4 * 64:  # NaN fails too
            return f"oneDNN's linear is off by {error:.3g} from torch's at {rows} rows"
    return None


@functools.cache
def _usable() -> bool:
    reason = unavailable()
    if reason is None:
        log.info("float32 products of many rows: oneDNN (epd.engine.onednn_linear)")
    else:
        log.warning("float32 products stay with torch's (MKL): %s", reason)
    return reason is None


def available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether `linear` takes a model's products in `dtype` here: float32 (torch sends other dtypes to
    oneDNN already), oneDNN checked once per process, and logged."""
    return dtype == torch.float32 and _usable()
