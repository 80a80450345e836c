"""A prompt step's last decoder layer computed only for the rows whose logits are kept.

Every layer of a prompt step writes each token's keys and values to the cache, and every layer but
the last needs each token's output, for the next layer's keys and values. The last layer's output
goes only to the final norm and the LM head, which read just the rows `logits_to_keep` picks: each
decode and each prompt chunk's last token when it samples (the prompt's last chunk). So in that
layer the attention computes those rows' queries only (`attention.chunk_queries`: a chunk's last
row sees its whole context, no mask), and the queries' and the output's projections and the MLP
(a MoE's router and experts included) run on those rows only; the other rows' outputs are zeros,
which nothing reads. Its keys and values are still computed and written for every token.

On the small checkpoints (6 layers) a one-image prompt step took 12-16% less CPU (one thread,
medians of 8 prompts, both ways interleaved in one process, three runs each: Kimi 213 -> 180, 205
-> 179 ms; Qwen 159 -> 140, 172 -> 145); on full ones (48-61 layers) the saving is 1-2%.

Bits: the kept rows go through the same layer with fewer rows beside them, and few rows take other
kernels than many (the native decode products up to 16 rows and `moe_decode` instead of oneDNN's;
SDPA's flash kernel with one query instead of a block of them), so a kept row's logits can differ
from the whole layer's by float32 rounding (up to 4e-5 on Kimi small), as a row's bits already
differ between batches of other sizes and from `generate`'s MKL products. Greedy tokens stay
`generate`'s (tests/model).
"""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch

from epd.thread_setting import ThreadSetting

_kept: ThreadSetting[torch.Tensor | None] = ThreadSetting(None)


def kept_rows(rows: torch.Tensor | None) -> AbstractContextManager[None]:
    """While the calling thread runs a forward: the packed rows ([n] long) whose last-layer output is
    read, or None (every row)."""
    return _kept.set(rows)


# The last layer's modules whose rows are computed only where kept: the queries' projections (the
# attention reads only the kept rows' queries) and the output's, and the MLP; never the keys' or
# values' projections, whose every row goes to the cache.
ROW_MODULES = ("self_attn.q_proj", "self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.o_proj", "mlp")


def install_last(model: torch.nn.Module) -> int | None:
    """Install `install` on the last decoder layer's ROW_MODULES of `model` (a ForConditionalGeneration
    whose text model is `model.model.language_model`); returns that layer's index, or None where the
    model is laid out otherwise (then every row is computed)."""
    text = getattr(getattr(model, "model", None), "language_model", None)
    layers = getattr(text, "layers", None)
    if layers is None:
        return None
    index = text.config.num_hidden_layers - 1  # the text model loops over layers[:num_hidden_layers]
    layer = layers[index]
    if getattr(getattr(layer, "self_attn", None), "layer_idx", None) != index or not hasattr(layer, "mlp"):
        return None
    modules = dict(layer.named_modules())
    for name in ROW_MODULES:
        if name in modules:
            install(modules[name])
    return index


def install(module: torch.nn.Module) -> None:
    """Make `module` (one of the last decoder layer's, [1, T, in] -> [1, T, out] row by row) compute
    only the kept rows while `kept_rows` names them, zeros elsewhere; its forward as it is now (the
    class's or another install's) does the work."""
    inner = module.forward

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        rows = _kept.get()
        if rows is None:
            return inner(hidden)
        kept = inner(hidden[:, rows])  # [1, n, out]
        out = kept.new_zeros(*hidden.shape[:-1], kept.shape[-1])  # [1, T, out]
        out[:, rows] = kept
        return out

    module.forward = forward
