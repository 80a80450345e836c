"""Row counts padded to a few sizes for oneDNN's per-shape kernels (bfloat16/float16 on a CPU only)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from epd.models.shape_buckets import bucket_rows, install, pads_rows


def test_up_to_16_rows_stay_and_above_pad_to_one_of_8_sizes_per_octave():
    assert [bucket_rows(n) for n in (1, 7, 16)] == [1, 7, 16]
    assert [bucket_rows(n) for n in (17, 18, 31, 32, 33)] == [18, 18, 32, 32, 36]
    assert [bucket_rows(n) for n in (84, 300, 333, 352, 1500)] == [88, 320, 352, 352, 1536]
    for n in range(17, 5000):  # never fewer rows, at most 1/8 more, and few distinct sizes
        assert n <= bucket_rows(n) <= n + n // 8
    assert sorted({bucket_rows(n) for n in range(257, 513)}) == list(range(288, 513, 32))


def test_only_reduced_precision_on_a_cpu_is_padded():
    cpu = torch.device("cpu")
    assert pads_rows(torch.bfloat16, cpu) and pads_rows(torch.float16, cpu)
    assert not pads_rows(torch.float32, cpu)
    assert not pads_rows(torch.bfloat16, torch.device("cuda"))


def test_a_padded_linear_keeps_the_input_shape_and_the_values(monkeypatch):
    import epd.models.shape_buckets as shape_buckets

    rows_seen = []  # the row count each product actually ran with
    real_linear = F.linear
    monkeypatch.setattr(shape_buckets.F, "linear",
                        lambda x, *rest: rows_seen.append(x.numel() // x.shape[-1]) or real_linear(x, *rest))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48).bfloat16(), torch.nn.Linear(48, 8))  # the second stays float32
    assert install(model) == 1
    layer = model[0]
    seen = []
    layer.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    x = torch.randn(3, 7, 64).bfloat16()  # 21 rows -> 22 in the product
    out = layer(x)
    assert out.shape == (3, 7, 48) and seen == [(3, 7, 48)]
    assert rows_seen == [22]
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias))  # the last bit may differ
    small = torch.randn(5, 64).bfloat16()  # 5 rows: not padded, the library's exact result
    assert torch.equal(layer(small), F.linear(small, layer.weight, layer.bias))
    assert model[1].forward.__func__ is torch.nn.Linear.forward
