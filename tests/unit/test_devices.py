"""--device, --dtype auto and epd serve --gpus: parsing, resolution and the per-worker GPU plan (pure)."""

from __future__ import annotations

import pytest
import torch

from epd.devices import assign_gpus, check_device, parse_gpus, resolve_device
from epd.dtypes import resolve_dtype

WORKERS = [("encoder-0", "encoder"), ("prefill-0", "prefill"), ("decode-0", "decode"), ("decode-1", "decode"),
           ("router", "router")]


def test_device_spellings():
    for name in ("auto", "cpu", "cuda", "cuda:3"):
        assert check_device(name) == name
    for bad in ("gpu", "cuda:", "cuda:x", "CPU", ""):
        with pytest.raises(ValueError, match="--device must be"):
            check_device(bad)


def test_resolution_without_and_with_gpus():
    assert resolve_device("auto", cuda_count=0) == torch.device("cpu")
    assert resolve_device("auto", cuda_count=2) == torch.device("cuda", 0)
    assert resolve_device("cuda:1", cuda_count=2) == torch.device("cuda", 1)
    assert resolve_device("cpu", cuda_count=2) == torch.device("cpu")
    with pytest.raises(ValueError, match="--device cuda: this machine has 0 CUDA"):
        resolve_device("cuda", cuda_count=0)
    with pytest.raises(ValueError, match="--device cuda:2: this machine has 2"):
        resolve_device("cuda:2", cuda_count=2)


def test_dtype_auto_follows_the_device():
    assert resolve_dtype("auto") is torch.float32
    assert resolve_dtype("auto", torch.device("cpu")) is torch.float32
    assert resolve_dtype("auto", torch.device("cuda", 0)) is torch.bfloat16
    assert resolve_dtype("float16", torch.device("cpu")) is torch.float16


def test_gpu_plan():
    assert parse_gpus("auto", visible=0) == [] and parse_gpus("auto", visible=2) == [0, 1]
    assert parse_gpus("3,1", visible=0) == [3, 1]
    for bad in ("x", "0,0", "-1", "0,,1"):
        with pytest.raises(ValueError, match="--gpus"):
            parse_gpus(bad, visible=4)
    assert assign_gpus(WORKERS, [0, 1, 2, 3]) == {"encoder-0": "0", "prefill-0": "1", "decode-0": "2",
                                                  "decode-1": "3"}
    assert assign_gpus(WORKERS, [5, 7]) == {"encoder-0": "5", "prefill-0": "7", "decode-0": "5", "decode-1": "7"}
    assert assign_gpus(WORKERS, []) == {name: "" for name, role in WORKERS if role != "router"}
