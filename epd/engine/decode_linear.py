"""A float32 decode step's dense layers through one native call each (epd/kernels/linear_decode.cpp).

At a decode step's few rows MKL's float32 product reads the weights at a third to a half of one
core's bandwidth, and at batch 1-8 a float32 step is mostly its dense layers' weights going by
(Kimi small: 48 products per step, 5.5 of a 20.5 ms step at batch 2). The kernel reads each weight
once per four rows; against `F.linear`, weights out of cache, AVX2 Zen 3 (/tmp/s30_lin.py), one
thread: 1.05-1.4x as fast at 1 row, 1.5-2.2x at 2, 1.6-2.6x at 4, 1.2-2.2x at 8, 1.0-1.5x at 16
and 0.85-0.96x at 32; two threads: 1.7-2.4x at 2-4 rows, 1.0-2.0x at 8, 0.73-1.44x at 16. On an
AVX-512 Zen 4, since the kernel's L2 prefetches (stop 34), 1.25-1.6x at 16 rows and 1.1-1.3x at 32
(one thread); whole steps with the limit swapped every 5 steps in one process: Kimi small batch 16
26.7 -> 23.3 ms at 8 -> 16 (two threads 23.9 -> 22.1), Qwen small 30.0 -> 28.0, batch 12 23.5 ->
19.8; past 16 no gain on two threads (batch 32: 34.7 against 35.2). So it takes calls of up to
`MAX_ROWS` rows; a prompt step's products go to oneDNN where it is available (onednn_linear.py),
else to MKL, and a decode-only step's batches past MAX_ROWS to MKL.

The sums run in another order than MKL's, so an output differs from the library's by a few units in
float32's last place, as the products of a batch of 16 already differ from those of batch 1 in MKL.
bfloat16 products stay with oneDNN, which reads a few rows' weights at its bandwidth.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from epd.engine import onednn_linear
from epd.kernels import WIDTH_MULTIPLE
from epd.models.rerouting import reroute

MAX_ROWS = 16


def takes(module: torch.nn.Module) -> bool:
    """A bias-free float32 nn.Linear on a CPU whose input width the kernel divides evenly; pure."""
    return (type(module) is torch.nn.Linear and module.bias is None and module.weight.dtype == torch.float32
            and module.weight.device.type == "cpu" and module.weight.is_contiguous()
            and module.in_features % WIDTH_MULTIPLE == 0)


def decode_linear_forward(self, x: torch.Tensor) -> torch.Tensor:
    """x [..., in] -> [..., out]: the kernel for 1..MAX_ROWS float32 rows, else `F.linear`. Past
    MAX_ROWS straight to the library (a detour through the native call costs a dispatch); below it
    the rest of the choice and the reshapes run inside one native call: in Python they had cost 6-7
    us a call, 49 calls a Kimi decode step."""
    if x.numel() > MAX_ROWS * x.shape[-1]:
        return F.linear(x, self.weight)
    return torch.ops.epd.linear_rows(x, self.weight, MAX_ROWS)


def decode_linear_forward_onednn(self, x: torch.Tensor) -> torch.Tensor:
    """As `decode_linear_forward`, past MAX_ROWS through oneDNN (onednn_linear.py) instead of MKL,
    but in a decode-only step (onednn_linear.decode_step)."""
    if x.numel() > MAX_ROWS * x.shape[-1] and not onednn_linear.decoding():
        return onednn_linear.linear(x, self.weight)
    return decode_linear_forward(self, x)


def install(model: torch.nn.Module, onednn: bool = False) -> int:
    """Route every linear of `model` that `takes` through `decode_linear_forward` (`onednn`: its
    oneDNN variant); returns how many."""
    return reroute(model, takes, decode_linear_forward_onednn if onednn else decode_linear_forward)
