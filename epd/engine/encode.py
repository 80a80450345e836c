"""Encoder side, in process: the owned image processor, then the vision tower + projector in one batch."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from PIL import Image

from epd.engine import fused_gelu, onednn_linear, vision_attention
from epd.engine.native_kernels import ENCODER_KERNELS, use_native_kernels
from epd.models import patch_embed
from epd.models.loading import EncoderModel
from epd.models.registry import ImageTensors


@dataclass(frozen=True)
class EncodedImage:
    """One image's encoder output: all that the language side needs, no pixels, no processor."""

    tensors: ImageTensors  # e.g. {"pooler_output": [N, H]} (+ "deepstack.k": [N, H] for Qwen3-VL)
    grid_thw: tuple[int, int, int]  # patch grid before spatial merge

    @property
    def nbytes(self) -> int:
        """Bytes of all its tensors: what it costs in an embedding cache."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())

    @property
    def num_tokens(self) -> int:
        return int(self.tensors["pooler_output"].shape[0])


def owned(t: torch.Tensor) -> torch.Tensor:
    """`t` in storage of its own: a slice of the batch's output would keep the whole batch alive in a
    cache that charges it only its own bytes."""
    if t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone(memory_format=torch.contiguous_format)


class ImageEncoder:
    """Runs a batch of images through the processor it owns and the vision side of the model."""

    def __init__(self, encoder: EncoderModel, kernels: str = "auto") -> None:
        """`kernels`: auto | native | torch, as the engine's (epd.engine.native_kernels); native ones
        run the vision tower's GELU (fused_gelu.py), and in float32 its linears, patch embedding and
        attention's products go through oneDNN (onednn_linear.py, vision_attention.py)."""
        if encoder.image_processor is None:  # load_encoder never allows this; keep the invariant loud
            raise ValueError(f"{encoder.model_dir}: an encoder needs an image processor")
        self.encoder = encoder
        weight = next(encoder.model.parameters())
        if use_native_kernels(kernels, weight.device, weight.dtype, ENCODER_KERNELS):  # builds them on a first start
            fused_gelu.install(encoder.model)
            if onednn_linear.available(weight.dtype):
                onednn_linear.install(encoder.model)
                patch_embed.install(encoder.model, product=onednn_linear.encoder_linear)
                vision_attention.install(encoder.model)

    @property
    def device(self) -> torch.device:
        """Where the vision tower runs."""
        return next(self.encoder.model.parameters()).device

    @torch.inference_mode()
    def encode(self, images: list[Image.Image]) -> list[EncodedImage]:
        if not images:
            return []
        inputs = self.encoder.image_processor(images=[im.convert("RGB") for im in images], return_tensors="pt")
        grids = inputs["image_grid_thw"]  # [num_images, 3]
        weight = next(self.encoder.model.parameters())  # processors answer float32 on the CPU whatever the model
        output = self.encoder.model.get_image_features(
            pixel_values=inputs["pixel_values"].to(weight.device, weight.dtype), image_grid_thw=grids.to(weight.device),
            return_dict=True
        )
        per_image = self.encoder.adapter.split_output(output, len(images))
        return [
            EncodedImage(tensors={k: owned(v) for k, v in tensors.items()},
                         grid_thw=tuple(int(x) for x in grid))
            for tensors, grid in zip(per_image, grids.tolist(), strict=True)
        ]
