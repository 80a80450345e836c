"""Whether a column generated what transformers `generate` did, request by request (pure).

Every load `epd bench` sends is greedy (temperature 0, exactly `output_len` tokens), and so is the
`hf` column, so a correct server's output equals `generate(do_sample=False)`'s on the same
checkpoint and dtype, token for token: the project's first promise, checked on every benchmark
rather than only in tests. Token ids are compared where both sides have them (our gateway sends
them on every chunk; vLLM when asked); otherwise the text, which the `hf` column decodes as the
gateway and vLLM do by default (special tokens left out). Runs are paired run by run and requests
by index, as the ratios are; a request that failed on either side is not compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epd.bench.results import RequestResult


@dataclass(frozen=True)
class Agreement:
    equal: int  # compared requests whose output equals the reference's
    compared: int  # requests that finished on both sides
    by_text: int  # of those compared, how many on text alone (a side sent no token ids)
    first_difference: str | None = None  # where the first unequal request parted, for the reader

    def cell(self) -> str:
        """The table cell: `equal/compared`, marked where any request could only be compared as text."""
        return f"{self.equal}/{self.compared}" + (" text" if self.by_text else "")

    def to_dict(self) -> dict:
        return {"equal": self.equal, "compared": self.compared, "by_text": self.by_text,
                "first_difference": self.first_difference}


def first_difference(ours: RequestResult, reference: RequestResult) -> str | None:
    """None when the outputs are equal; else where they part (a token index, or just "text")."""
    if ours.output_ids is not None and reference.output_ids is not None:
        a, b = ours.output_ids, reference.output_ids
        if a == b:
            return None
        at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        return f"token {at + 1} of {len(b)}"
    return None if ours.output_text == reference.output_text else "text"


def agreement(runs: Sequence[Sequence[RequestResult]], reference_runs: Sequence[Sequence[RequestResult]]
              ) -> Agreement:
    """`runs[r]` against `reference_runs[r]`, each request against the reference's of the same index."""
    equal = compared = by_text = 0
    first: str | None = None
    for r, (results, references) in enumerate(zip(runs, reference_runs, strict=False)):
        by_index = {ref.index: ref for ref in references if ref.ok}
        for ours in results:
            reference = by_index.get(ours.index)
            if reference is None or not ours.ok:
                continue
            compared += 1
            if ours.output_ids is None or reference.output_ids is None:
                by_text += 1
            where = first_difference(ours, reference)
            if where is None:
                equal += 1
            elif first is None:
                first = f"run {r + 1}, request {ours.index}: {where}"
    return Agreement(equal, compared, by_text, first)
