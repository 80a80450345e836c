"""CheckedCompile: the compiled copy serves only after it has equalled the library's function bit for
bit on that kind of input; a mismatch or a failed compile leaves the library's function, and no call
fails or changes. Both families' vision rotary embeddings compile to the same bits."""

from __future__ import annotations

import logging
import sys

import pytest
import torch
from transformers.models.kimi_k25 import modeling_kimi_k25
from transformers.models.qwen3_vl_moe import modeling_qwen3_vl_moe

from epd.models import vision_rope
from epd.models.compiled import CheckedCompile, compile_enabled


def _affine(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x.float() * 3.0 + y.float() * 0.5).to(x.dtype)


def test_compiled_copy_serves_after_matching_the_eager_function():
    checked = CheckedCompile(_affine, "affine")
    x, y = torch.randn(37, 5), torch.randn(37, 5)
    assert torch.equal(checked(x, y), _affine(x, y))  # the first call checks
    calls = []
    checked._compiled = lambda *a: calls.append(a) or _affine(*a)  # now count who serves
    assert torch.equal(checked(x[:9], y[:9]), _affine(x[:9], y[:9]))
    assert len(calls) == 1 and checked.active


def test_a_new_dtype_is_checked_again_before_the_compiled_copy_serves_it():
    checked = CheckedCompile(_affine, "affine")
    checked(torch.randn(4, 3), torch.randn(4, 3))
    checked._compiled = lambda *a: _affine(*a) + 1  # wrong for any new kind of input
    x = torch.randn(4, 3).bfloat16()
    assert torch.equal(checked(x, x), _affine(x, x))
    assert not checked.active


def test_a_copy_that_differs_is_dropped_with_one_warning(caplog):
    checked = CheckedCompile(_affine, "affine")
    checked._compiled = lambda x, y: _affine(x, y).neg()
    x = torch.randn(6, 2)
    with caplog.at_level(logging.WARNING, logger="epd.models.compiled"):
        first, second = checked(x, x), checked(x, x)
    assert torch.equal(first, _affine(x, x)) and torch.equal(second, _affine(x, x))
    assert not checked.active
    assert [r.getMessage() for r in caplog.records] == [
        "affine: using the library's function, not a compiled copy: its output differs from the library's"]


def test_a_compile_that_fails_leaves_the_eager_function(caplog):
    def broken(*args):
        raise RuntimeError("no C++ compiler")

    checked = CheckedCompile(_affine, "affine")
    x = torch.randn(3, 3)
    checked(x, x)
    checked._compiled = broken  # a later recompile failing, on a kind already checked
    with caplog.at_level(logging.WARNING, logger="epd.models.compiled"):
        assert torch.equal(checked(x, x), _affine(x, x))
    assert not checked.active and "no C++ compiler" in caplog.text


@pytest.mark.parametrize("value, enabled", [(None, True), ("1", True), ("0", False), ("off", False),
                                            ("False", False)])
def test_epd_compile_switch(value, enabled):
    assert compile_enabled({} if value is None else {"EPD_COMPILE": value}) is enabled


def apply_rotary_pos_emb_vision(q, k, cos, sin):  # what install looks for, in the module of...
    return _affine(q, cos), _affine(k, sin)


_LIBRARY_ROPE = apply_rotary_pos_emb_vision


class _Attention(torch.nn.Module):  # ...a module's class
    pass


def test_install_replaces_the_name_in_each_module_the_model_is_built_from_once(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], vision_rope.NAME, _LIBRARY_ROPE)
    model = torch.nn.Sequential(_Attention(), _Attention())
    monkeypatch.setenv("EPD_COMPILE", "0")
    assert vision_rope.install(model) == 0
    monkeypatch.delenv("EPD_COMPILE")
    assert vision_rope.install(model) == 1 and vision_rope.install(model) == 0
    installed = getattr(sys.modules[__name__], vision_rope.NAME)
    assert isinstance(installed, CheckedCompile) and installed.eager is _LIBRARY_ROPE


@pytest.mark.parametrize("module", [modeling_kimi_k25, modeling_qwen3_vl_moe], ids=["kimi", "qwen"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_vision_rotary_embedding_compiles_to_the_library_bits(module, dtype):
    library = getattr(module, vision_rope.NAME)
    library = library.eager if isinstance(library, CheckedCompile) else library
    checked = CheckedCompile(library, "rope")
    generator = torch.Generator().manual_seed(3)
    for tokens in (301, 1024):  # [1, T, heads, head_dim]; cos and sin [T, head_dim], float32
        q, k = (torch.randn(1, tokens, 6, 64, generator=generator).to(dtype) for _ in range(2))
        angles = torch.rand(tokens, 64, generator=generator) * 40
        checked(q, k, angles.cos(), angles.sin())  # checks this kind, then serves compiled
        got = checked(q, k, angles.cos(), angles.sin())
        expected = library(q, k, angles.cos(), angles.sin())
        assert checked.active
        assert all(torch.equal(g, e) and g.dtype == dtype for g, e in zip(got, expected, strict=True))
