"""Patchifying convolutions rerouted to one linear: same output, other inputs and convolutions untouched."""

from __future__ import annotations

import pytest
import torch

from epd.models import patch_embed


def test_conv2d_and_conv3d_patches_equal_the_convolution():
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"two": torch.nn.Conv2d(3, 8, kernel_size=4, stride=4),
                                 "three": torch.nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4))})
    x2, x3 = torch.randn(5, 3, 4, 4), torch.randn(5, 3, 2, 4, 4)
    expected = model["two"](x2), model["three"](x3)
    assert patch_embed.install(model) == 2
    assert torch.allclose(model["two"](x2), expected[0], atol=1e-5)
    assert torch.allclose(model["three"](x3), expected[1], atol=1e-5)
    assert model["two"](x2).shape == (5, 8, 1, 1)


def test_larger_inputs_still_go_through_the_convolution():
    conv = torch.nn.Conv2d(3, 8, kernel_size=4, stride=4)
    x = torch.randn(2, 3, 8, 12)
    expected = conv(x)
    patch_embed.install(conv)
    assert torch.allclose(conv(x), expected) and conv(x).shape == (2, 8, 2, 3)


def test_overlapping_or_padded_convolutions_are_left_alone():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, kernel_size=3, stride=1),
                                torch.nn.Conv2d(8, 8, kernel_size=2, stride=2, padding=1))
    assert patch_embed.install(model) == 0


def test_a_given_product_computes_the_patches():
    torch.manual_seed(0)
    conv = torch.nn.Conv3d(3, 8, kernel_size=(2, 4, 4), stride=(2, 4, 4))
    x = torch.randn(5, 3, 2, 4, 4)
    expected = conv(x)
    calls = []

    def product(flat, weight, bias):
        calls.append((tuple(flat.shape), tuple(weight.shape)))
        return torch.nn.functional.linear(flat, weight, bias)

    assert patch_embed.install(conv, product=product) == 1
    assert torch.allclose(conv(x), expected, atol=1e-5)
    assert calls == [((5, 96), (8, 96))]
    conv(torch.randn(1, 3, 4, 8, 8))  # not single patches: the convolution, not the product
    assert len(calls) == 1


def test_onednns_encoder_product_equals_the_convolution():
    from epd.engine import onednn_linear

    if onednn_linear.unavailable() is not None:  # the encoder installs it only where oneDNN is usable
        pytest.skip(onednn_linear.unavailable())
    torch.manual_seed(1)
    conv = torch.nn.Conv2d(3, 16, kernel_size=14, stride=14)
    x = torch.randn(37, 3, 14, 14)
    expected = conv(x)
    patch_embed.install(conv, product=onednn_linear.encoder_linear)
    torch.testing.assert_close(conv(x), expected, rtol=1e-5, atol=1e-5)
