"""What each generated family looks like: special tokens, config and processor at each size.

Sizes: `tiny` (< 2M parameters, for unit and oracle tests) and `small` (50-150M, for benchmarks).
Token ids in the config are read back from the trained tokenizer, never hard-coded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from transformers import PretrainedConfig, PreTrainedTokenizerFast, ProcessorMixin

from epd.tiny.templates import KIMI_K25_CHAT_TEMPLATE, QWEN3_VL_CHAT_TEMPLATE

SIZES = ("tiny", "small")


@dataclass(frozen=True)
class TinyFamily:
    """How to generate one family's checkpoint."""

    model_type: str
    special_tokens: tuple[str, ...]
    eos_token: str
    pad_token: str
    bos_token: str | None
    chat_template: str
    vocab_size: dict[str, int]
    make_config: Callable[[str, PreTrainedTokenizerFast], PretrainedConfig]
    make_processor: Callable[[str, PreTrainedTokenizerFast], ProcessorMixin]


def _ids(tok: PreTrainedTokenizerFast, *tokens: str) -> list[int]:
    ids = tok.convert_tokens_to_ids(list(tokens))
    assert tok.unk_token_id not in ids or tok.unk_token_id is None, f"missing special tokens in {tokens}"
    return ids


# --- Kimi-K2.5: MoonViT + DeepSeek-V3 MoE (MLA attention, shared + routed experts) -------------------

# q_lora_rank is set at every size: with q_lora_rank=None the LM gets a plain `q_proj`, which
# transformers 5.24 save_pretrained wrongly folds into the vision tower's fused `wqkv` on reverse conversion.
_KIMI_TEXT = {
    "tiny": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                 kv_lora_rank=32, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16),
    "small": dict(hidden_size=512, intermediate_size=1536, moe_intermediate_size=256, num_hidden_layers=6,
                  num_attention_heads=8, num_key_value_heads=8, n_routed_experts=16, num_experts_per_tok=4,
                  kv_lora_rank=128, q_lora_rank=256, qk_rope_head_dim=32, qk_nope_head_dim=64, v_head_dim=64),
}
_KIMI_VISION = {
    "tiny": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                 pos_emb_height=32, pos_emb_width=32, pos_emb_time=4),
    "small": dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
                  pos_emb_height=64, pos_emb_width=64, pos_emb_time=4),
}
# Longest side in patches; the Kimi processor scales larger images down to it.
_KIMI_MAX_SIDE_PATCHES = {"tiny": 16, "small": 32}


def _kimi_config(size: str, tok: PreTrainedTokenizerFast) -> PretrainedConfig:
    from transformers import Kimi_K25Config

    image, video, start, end = _ids(
        tok, "<|media_pad|>", "<|kimi_k25_video_placeholder|>", "<|media_begin|>", "<|media_end|>"
    )
    eos, pad = _ids(tok, tok.eos_token, tok.pad_token)
    text = dict(
        model_type="deepseek_v3", vocab_size=len(tok), n_shared_experts=1, first_k_dense_replace=1,
        n_group=1, topk_group=1, routed_scaling_factor=2.5, max_position_embeddings=4096,
        bos_token_id=eos, eos_token_id=eos, pad_token_id=pad, **_KIMI_TEXT[size],
    )
    vision = dict(patch_size=14, merge_kernel_size=[2, 2], **_KIMI_VISION[size])
    return Kimi_K25Config(
        text_config=text, vision_config=vision, projection_hidden_size=vision["hidden_size"],
        image_token_id=image, video_token_id=video, vision_start_token_id=start, vision_end_token_id=end,
        tie_word_embeddings=True,
    )


def _kimi_processor(size: str, tok: PreTrainedTokenizerFast) -> ProcessorMixin:
    from transformers import Kimi_K25ImageProcessor, Kimi_K25Processor, Kimi_K25VideoProcessor

    side = _KIMI_MAX_SIDE_PATCHES[size] * 14
    image = Kimi_K25ImageProcessor(size={"max_height": side, "max_width": side}, max_patches=side * side)
    video = Kimi_K25VideoProcessor(size={"max_height": side, "max_width": side})
    return Kimi_K25Processor(image_processor=image, tokenizer=tok, video_processor=video,
                             chat_template=tok.chat_template)


KIMI_K25 = TinyFamily(
    model_type="kimi_k25",
    special_tokens=("[EOS]", "<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>",
                    "<|im_middle|>", "<|media_begin|>", "<|media_content|>", "<|media_end|>",
                    "<|media_pad|>", "<|kimi_k25_video_placeholder|>"),
    eos_token="<|im_end|>",
    pad_token="[EOS]",
    bos_token=None,
    chat_template=KIMI_K25_CHAT_TEMPLATE,
    vocab_size={"tiny": 1024, "small": 8192},
    make_config=_kimi_config,
    make_processor=_kimi_processor,
)

# --- Qwen3-VL-MoE: ViT with deepstack features + Qwen3 MoE text model, M-RoPE positions --------------

_QWEN_TEXT = {
    "tiny": dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
                 num_experts_per_tok=2),
    "small": dict(hidden_size=512, intermediate_size=1536, moe_intermediate_size=256, num_hidden_layers=6,
                  num_attention_heads=8, num_key_value_heads=4, head_dim=64, num_experts=16,
                  num_experts_per_tok=4),
}
_QWEN_VISION = {
    "tiny": dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, num_position_embeddings=256,
                 deepstack_visual_indexes=[0]),
    "small": dict(depth=6, hidden_size=384, intermediate_size=1024, num_heads=6,
                  num_position_embeddings=1024, deepstack_visual_indexes=[1, 3]),
}
# Rotary half-dims given to (t, h, w); they sum to head_dim / 2, in Qwen3-VL's proportions.
_QWEN_MROPE_SECTION = {"tiny": [4, 2, 2], "small": [12, 10, 10]}
# Pixel budget of one image: (min, max) pixels; the processor rescales into it.
_QWEN_PIXELS = {"tiny": (32 * 32 * 4, 32 * 32 * 64), "small": (32 * 32 * 4, 32 * 32 * 256)}


def _qwen_config(size: str, tok: PreTrainedTokenizerFast) -> PretrainedConfig:
    from transformers import Qwen3VLMoeConfig

    image, video, start, end = _ids(tok, "<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
    eos, pad = _ids(tok, tok.eos_token, tok.pad_token)
    text = dict(
        vocab_size=len(tok), max_position_embeddings=4096, decoder_sparse_step=1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "mrope_section": _QWEN_MROPE_SECTION[size], "mrope_interleaved": True},
        bos_token_id=eos, eos_token_id=eos, pad_token_id=pad, tie_word_embeddings=False, **_QWEN_TEXT[size],
    )
    vision = dict(patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                  out_hidden_size=text["hidden_size"], **_QWEN_VISION[size])
    return Qwen3VLMoeConfig(
        text_config=text, vision_config=vision, image_token_id=image, video_token_id=video,
        vision_start_token_id=start, vision_end_token_id=end, tie_word_embeddings=False,
    )


def _qwen_processor(size: str, tok: PreTrainedTokenizerFast) -> ProcessorMixin:
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    low, high = _QWEN_PIXELS[size]
    image = Qwen2VLImageProcessor(
        size={"shortest_edge": low, "longest_edge": high}, patch_size=16, temporal_patch_size=2,
        merge_size=2, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    )
    video = Qwen3VLVideoProcessor(patch_size=16, temporal_patch_size=2, merge_size=2)
    return Qwen3VLProcessor(image_processor=image, tokenizer=tok, video_processor=video,
                            chat_template=tok.chat_template)


QWEN3_VL_MOE = TinyFamily(
    model_type="qwen3_vl_moe",
    special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                    "<|image_pad|>", "<|video_pad|>"),
    eos_token="<|im_end|>",
    pad_token="<|endoftext|>",
    bos_token=None,
    chat_template=QWEN3_VL_CHAT_TEMPLATE,
    vocab_size={"tiny": 1024, "small": 8192},
    make_config=_qwen_config,
    make_processor=_qwen_processor,
)

FAMILIES: dict[str, TinyFamily] = {f.model_type: f for f in (KIMI_K25, QWEN3_VL_MOE)}
