"""A Qwen3-VL-MoE checkpoint written by plain transformers and tokenizers code, not by `make-tiny-model`.

A config, a model at its own initialisation (then scaled so greedy output varies), the PIL variant
of the Qwen2-VL image processor, and `save_pretrained` for both. Shared by model and e2e tests.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
           "<|image_pad|>", "<|video_pad|>"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{% if p['type'] == 'image' %}<|vision_start|><|image_pad|>"
    "<|vision_end|>{% else %}{{ p['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tokenizer():
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = ["a photo of a small red house near the sea", "what is in this picture? describe it"] * 50
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=TEMPLATE, additional_special_tokens=SPECIAL)


def write_plain_qwen_checkpoint(out: Path) -> str:
    """Write the checkpoint into `out` (created) and return its path."""
    from transformers import (
        GenerationConfig,
        Qwen2VLImageProcessorPil,
        Qwen3VLMoeConfig,
        Qwen3VLMoeForConditionalGeneration,
        Qwen3VLProcessor,
        Qwen3VLVideoProcessor,
    )

    out.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer()
    ids = dict(zip(SPECIAL, tok.convert_tokens_to_ids(SPECIAL), strict=True))
    config = Qwen3VLMoeConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=48, intermediate_size=96, moe_intermediate_size=24,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                         num_experts=4, num_experts_per_tok=2, eos_token_id=ids["<|im_end|>"],
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "mrope_section": [2, 2, 2], "mrope_interleaved": True}),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16,
                           out_hidden_size=48, num_position_embeddings=256, deepstack_visual_indexes=[1]),
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(3)
    model = Qwen3VLMoeForConditionalGeneration(config)
    with torch.no_grad():  # the library's init repeats one token forever; give the weights some scale
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 2.0 / p.shape[-1] ** 0.5)
    model.generation_config = GenerationConfig(eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    model.save_pretrained(out)
    image_processor = Qwen2VLImageProcessorPil(size={"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 48},
                                               patch_size=16, merge_size=2)
    Qwen3VLProcessor(image_processor=image_processor, tokenizer=tok,
                     video_processor=Qwen3VLVideoProcessor(patch_size=16), chat_template=TEMPLATE).save_pretrained(out)
    return str(out)
