"""float32 products through oneDNN (epd.engine.onednn_linear): the row counts they run at (pure), their
results against torch's within float32 rounding, each row's bits independent of the rows beside it,
and the experts' prompt path through them against the library's grouped products."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from epd.engine import onednn_linear
from epd.engine.onednn_linear import linear, padded_rows

needs_onednn = pytest.mark.skipif(onednn_linear.unavailable() is not None,
                                  reason=str(onednn_linear.unavailable()))


@pytest.mark.parametrize("rows, fine, expected", [
    (1, False, 2), (1, True, 2),  # a lone row runs as two: oneDNN takes another kernel for one row
    (2, False, 2), (16, False, 16), (17, False, 18), (33, False, 36), (337, False, 352), (1024, False, 1024),
    (1025, False, 1152),
    (64, True, 64), (65, True, 66), (337, True, 344), (784, True, 784), (1024, True, 1024), (1025, True, 1056),
])
def test_row_counts_the_products_run_at(rows, fine, expected):
    assert padded_rows(rows, fine) == expected


def _weights(out: int, width: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(out, width, generator=generator), torch.randn(out, generator=generator)


@needs_onednn
@pytest.mark.parametrize("rows", [1, 5, 40, 300])
@pytest.mark.parametrize("fine", [False, True])
def test_equals_torch_within_float32_rounding(rows, fine):
    weight, bias = _weights(96, 128)
    x = torch.randn(2, rows, 128, generator=torch.Generator().manual_seed(rows))  # [B, M, K]: leading dims kept
    got = linear(x, weight, bias, fine=fine)
    assert got.shape == (2, rows, 96) and got.dtype == torch.float32
    torch.testing.assert_close(got, F.linear(x, weight, bias), rtol=1e-5, atol=1e-4)
    assert not torch.equal(linear(x, weight, None, fine), got)  # the bias is applied


@needs_onednn
@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(threads):
    """What a prompt's token computes alone, chunked or batched with other prompts must be the same
    bits: every row count (and the padding to buckets) gives each row the same result."""
    weight, _ = _weights(160, 256, seed=1)
    x = torch.randn(400, 256, generator=torch.Generator().manual_seed(2))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        whole = linear(x, weight)
        for start, rows in [(0, 1), (7, 1), (0, 2), (3, 16), (5, 17), (11, 100), (0, 337)]:
            part = linear(x[start:start + rows], weight)
            assert torch.equal(part, whole[start:start + rows]), (start, rows)
    finally:
        torch.set_num_threads(before)


@needs_onednn
def test_install_routes_float32_linears_and_keeps_their_outputs():
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.GELU(), torch.nn.Linear(32, 8, bias=False))
    x = torch.randn(50, 64)
    with torch.inference_mode():
        expected = model(x)
        assert onednn_linear.install(model) == 2
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)


def test_only_float32_cpu_linears_are_taken():
    assert onednn_linear.takes(torch.nn.Linear(8, 8))
    assert not onednn_linear.takes(torch.nn.Linear(8, 8).to(torch.bfloat16))  # torch sends those to oneDNN already
    assert not onednn_linear.takes(torch.nn.Conv1d(8, 8, 1))


@needs_onednn
@pytest.mark.parametrize("tokens", [3, 40, 200])
def test_the_experts_prompt_path_through_onednn_is_the_librarys_within_rounding(tokens, monkeypatch):
    from transformers.integrations.moe import grouped_mm_experts_forward
    from transformers.models.qwen3_vl_moe.configuration_qwen3_vl_moe import Qwen3VLMoeTextConfig
    from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextExperts

    from epd.kernels.native import load_kernels
    from epd.models import experts

    assert load_kernels().ok
    monkeypatch.setattr(experts, "_decodes_natively", lambda *args: False)  # the prompt path, not moe_decode's
    calls = []
    real = experts._onednn_products
    monkeypatch.setattr(experts, "_onednn_products", lambda *a: calls.append(1) or real(*a))
    layer = Qwen3VLMoeTextExperts(Qwen3VLMoeTextConfig(hidden_size=64, moe_intermediate_size=32, num_experts=8,
                                                       num_experts_per_tok=2))
    generator = torch.Generator().manual_seed(tokens)
    with torch.no_grad():
        layer.gate_up_proj.normal_(0, 0.2, generator=generator)
        layer.down_proj.normal_(0, 0.2, generator=generator)
    rows = torch.randn(tokens, 64, generator=generator)
    index = torch.stack([torch.randperm(8, generator=generator)[:2] for _ in range(tokens)])  # [T, 2]
    weights = torch.softmax(torch.randn(tokens, 2, generator=generator), dim=-1)
    with torch.inference_mode():
        ours = experts.onednn_experts_forward(layer, rows, index, weights)
        theirs = grouped_mm_experts_forward(layer, rows, index, weights)
    assert calls == [1]
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert ours.abs().max() > 0.1  # not a product of zeros


@needs_onednn
def test_weights_that_are_views_give_the_same_result():
    """A transposed weight (experts stored [E, in, out]) and rows of a wider tensor (a head's keys)."""
    x = torch.randn(30, 64, generator=torch.Generator().manual_seed(5))
    wide, _ = _weights(48, 128, seed=6)
    for weight in (wide[:, :64], wide[:, :64].contiguous().t().contiguous().t()):
        torch.testing.assert_close(linear(x, weight), F.linear(x, weight), rtol=1e-5, atol=1e-4)


@needs_onednn
def test_a_decode_only_steps_products_past_sixteen_rows_stay_with_torch():
    from epd.engine import decode_linear
    from epd.kernels.native import load_kernels

    assert load_kernels().ok
    layer = torch.nn.Linear(64, 48, bias=False)
    decode_linear.install(layer, onednn=True)
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(7))  # past decode_linear.MAX_ROWS
    with torch.inference_mode():
        with onednn_linear.decode_step(True):
            assert onednn_linear.decoding()
            assert torch.equal(layer(x), F.linear(x, layer.weight))
        assert not onednn_linear.decoding()
        assert torch.equal(layer(x), linear(x, layer.weight))  # a prompt step's rows: oneDNN
