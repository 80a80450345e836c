"""Row counts rounded up to a few sizes, for the products a CPU library builds a kernel for per shape.

On a CPU, bfloat16/float16 matrix products go through oneDNN, which builds (JIT-compiles) a kernel
the first time it meets a shape and keeps it in a cache. A prompt step has as many rows as the
tokens it carries, a count that differs at nearly every step, so every linear layer and expert
product of a prompt step built its kernels anew: a 333-token prompt took 80 ms when its length was
new, 61 ms for another prompt of a length already seen (Kimi small, bfloat16, one thread; 8.6 ms of
it in oneDNN's own log of the builds). So row counts above 16 are padded up to one of 8 sizes per
octave (at most 1/8 more rows, zeros), and after a warm-up a prompt step finds its kernels built.
Up to 16 rows (decode batches) are few sizes already and stay as they are. float32 goes through
MKL, which builds nothing per shape (a new length cost the same as a seen one), and is left alone
here; where the native kernels send float32 products to oneDNN instead, epd.engine.onednn_linear
rounds their rows up to the same buckets itself.
A padded product's real rows can still differ in the last bit from the unpadded one's (oneDNN may
pick another kernel for another row count), as they already do between batches of other sizes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from epd.models.rerouting import reroute


def round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def bucket_rows(rows: int, fraction_bits: int = 4) -> int:
    """`rows` rounded up to a multiple of 2^-fraction_bits of its power of two, for rows above
    2^fraction_bits (4: 1/16, 8 sizes an octave; 6: 1/64, 32 sizes an octave); pure."""
    return rows if rows <= 1 << fraction_bits else round_up(rows, 1 << (rows.bit_length() - fraction_bits))


def pads_rows(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether products of this dtype on this device are built per shape (oneDNN on a CPU); pure."""
    return device.type == "cpu" and dtype in (torch.bfloat16, torch.float16)


def padded_product(x: torch.Tensor, rows_to: Callable[[int], int],
                   product: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """x [..., in] -> [..., out]: `product` of x's rows flattened ([M, in], contiguous) with zero rows
    below up to `rows_to(M)`, whose outputs are dropped (a product's rows are independent)."""
    rows = x.numel() // x.shape[-1]
    target = rows_to(rows)
    flat = x.reshape(rows, x.shape[-1])  # [M, in]
    flat = F.pad(flat, (0, 0, 0, target - rows)) if target != rows else flat.contiguous()  # [target, in]
    out = product(flat)[:rows]  # [M, out]
    return out.view(*x.shape[:-1], out.shape[-1])


def padded_linear_forward(self, x: torch.Tensor) -> torch.Tensor:
    """nn.Linear's forward with the rows ([..., in] flattened) padded to `bucket_rows`."""
    return padded_product(x, bucket_rows, lambda flat: F.linear(flat, self.weight, self.bias))


def install(model: torch.nn.Module) -> int:
    """Pad the rows of every nn.Linear of `model` whose weight oneDNN would build kernels for; returns how many."""
    def chosen(module: torch.nn.Module) -> bool:
        return isinstance(module, torch.nn.Linear) and pads_rows(module.weight.dtype, module.weight.device)

    return reroute(model, chosen, padded_linear_forward)
