"""The by-part step timer: naming, own times and the sum per part on exact numbers, then the hooks
on a small real module tree."""

from __future__ import annotations

import pytest
import torch

from epd.bench.step_parts import OUTSIDE, ROOT, StepParts, by_part, format_parts, own_times, part_of, time_parts


def test_parts_are_named_below_the_decoder_layer():
    assert part_of("model.language_model.layers.3.self_attn.q_proj") == "layer.self_attn.q_proj"
    assert part_of("model.layers.12.mlp.experts") == "layer.mlp.experts"
    assert part_of("model.layers.0") == "layer"
    assert part_of("layers.1.input_layernorm") == "layer.input_layernorm"
    assert part_of("model.language_model.norm") == "language_model.norm"
    assert part_of("lm_head") == "lm_head"
    assert part_of("") == ROOT
    assert part_of("model.multilayers.2.x") == "2.x"  # only a `layers` component marks a layer


def test_own_time_is_inclusive_less_the_nearest_timed_children():
    inclusive = {"": 10.0, "m": 9.0, "m.layers.0": 4.0, "m.layers.0.attn": 3.0, "m.layers.0.attn.q.inner": 1.0,
                 "m.layers.1": 4.5, "m.layers.1.attn": 2.0, "head": 0.5}
    own = own_times(inclusive)
    assert own == pytest.approx({"": 0.5, "m": 0.5, "m.layers.0": 1.0, "m.layers.0.attn": 2.0,
                                 "m.layers.0.attn.q.inner": 1.0, "m.layers.1": 2.5, "m.layers.1.attn": 2.0,
                                 "head": 0.5})
    assert sum(own.values()) == pytest.approx(inclusive[""])  # nothing counted twice


def test_layers_add_up_to_one_line_per_part():
    own = {"m.layers.0.attn": 2.0, "m.layers.1.attn": 2.5, "m.layers.0": 1.0, "m.layers.1": 1.5, "": 0.25}
    assert by_part(own) == {"layer.attn": 4.5, "layer": 2.5, ROOT: 0.25}


class _Slow(torch.nn.Module):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x):
        import time
        time.sleep(self.seconds)
        return x


class _Cache:
    def update(self, x):
        import time
        time.sleep(0.001)
        return x


class _Attention(_Slow):
    def __init__(self, cache: _Cache) -> None:
        super().__init__(0.003)
        self.cache = cache

    def forward(self, x):
        return super().forward(self.cache.update(x))


class _Layer(torch.nn.Module):
    def __init__(self, cache: _Cache) -> None:
        super().__init__()
        self.attn = _Attention(cache)
        self.mlp = _Slow(0.002)

    def forward(self, x):
        return self.mlp(self.attn(x))


def test_hooks_time_each_part_and_what_is_outside_the_model():
    cache = _Cache()
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([_Layer(cache), _Layer(cache)])
    model.forward = lambda x: model.layers[1](model.layers[0](x))
    import time

    def step():
        time.sleep(0.003)  # packing and sampling
        model(torch.zeros(1))

    result = time_parts(model, step, steps=3, calls=[(cache, "update", "cache")])
    assert result.parts["layer.attn"] == pytest.approx(0.006, abs=0.003)  # its cache calls are their own part
    assert result.parts["layer.attn.(cache)"] == pytest.approx(0.002, abs=0.0015)
    assert result.parts["layer.mlp"] == pytest.approx(0.004, abs=0.003)
    assert result.parts[OUTSIDE] == pytest.approx(0.003, abs=0.002)
    assert result.step_s == pytest.approx(sum(result.parts.values()), abs=0.002)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())  # removed after
    assert "update" not in vars(cache)  # the class's method again
    table = format_parts(result, batch=4)
    assert "layer.attn" in table.splitlines()[1]  # largest first


def test_format_folds_the_smallest_parts_but_keeps_the_timed_calls_asked_for():
    parts = {f"layer.part{i}": 0.010 - i * 0.001 for i in range(5)} | {"layer.self_attn.(kernel)": 0.0001}
    table = format_parts(StepParts(0.05, parts), batch=2, limit=2).splitlines()[1:]
    assert [line.split()[0] for line in table] == ["layer.part0", "layer.part1", "4"]
    assert "4 more" in table[-1]
    kept = format_parts(StepParts(0.05, parts), batch=2, limit=2, always=["kernel"]).splitlines()[1:]
    names = [line.split()[0] for line in kept]
    assert names[:3] == ["layer.part0", "layer.part1", "layer.self_attn.(kernel)"]
    assert "3 more" in kept[-1]
