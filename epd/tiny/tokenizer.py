"""A real byte-level BPE tokenizer, trained here on a built-in corpus, carrying a family's special tokens.

The model hub is out of reach, so a checkpoint's tokenizer is trained on the spot with the `tokenizers`
library. Byte-level BPE round-trips any UTF-8 text, so prompts outside the corpus still tokenize.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

_WORDS = (
    "the a an image picture photo of in on at with and or but cat dog bird tree house car road sky sea "
    "red green blue yellow black white small large bright dark left right top bottom center near far "
    "what is shown describe this that there here how many one two three four five colour shape "
    "model token expert router layer encoder decoder prefill cache batch stream request answer question "
    "hello world please tell me about you we they it can will should would could see look find "
    "morning evening light shadow water stone grass flower window door table chair book page word"
).split()


def training_corpus(seed: int, num_lines: int = 4000) -> Iterator[str]:
    """Deterministic pseudo-sentences over a small vocabulary, plus digits and punctuation."""
    rng = random.Random(seed)
    for _ in range(num_lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(3, 14))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 9999)))
        line = " ".join(words)
        yield line[0].upper() + line[1:] + rng.choice([".", "?", "!", ",", ":"])


def train_bpe(vocab_size: int, special_tokens: Sequence[str], seed: int) -> Tokenizer:
    """Train a byte-level BPE of `vocab_size` entries; special tokens get the first ids, in order."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_corpus(seed), trainer=trainer)
    return tokenizer


def build_tokenizer(
    vocab_size: int,
    special_tokens: Sequence[str],
    seed: int,
    *,
    eos_token: str,
    pad_token: str,
    bos_token: str | None,
    chat_template: str,
    extra_attributes: dict[str, str] | None = None,
) -> PreTrainedTokenizerFast:
    """A transformers fast tokenizer around a freshly trained BPE, ready for `save_pretrained`."""
    fast = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(vocab_size, special_tokens, seed),
        eos_token=eos_token,
        pad_token=pad_token,
        bos_token=bos_token,
        chat_template=chat_template,
        model_max_length=8192,
        **(extra_attributes or {}),
    )
    fast.add_special_tokens({"additional_special_tokens": list(special_tokens)})
    return fast
