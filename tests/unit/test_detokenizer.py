"""IncrementalDetokenizer against one full decode of a real byte-level BPE; StopMatcher on split chunks."""

from __future__ import annotations

import random

import pytest

from epd.tiny.families import FAMILIES
from router.detokenizer import IncrementalDetokenizer, StopMatcher

TEXT = "naïve 東京 🚀 the cat sat. Ünïcödé ∑ 👩‍👩‍👧 done"


def family_tokenizer(family: str):
    from epd.tiny.tokenizer import build_tokenizer

    spec = FAMILIES[family]
    return build_tokenizer(
        spec.vocab_size["tiny"], spec.special_tokens, 0, eos_token=spec.eos_token, pad_token=spec.pad_token,
        bos_token=spec.bos_token, chat_template=spec.chat_template,
    )


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def tokenizer(request):
    return family_tokenizer(request.param)


def stream(tokenizer, ids: list[int], chunk_sizes: list[int], skip_special_tokens: bool = True) -> list[str]:
    """Every piece the detokenizer returns, the flush last."""
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
    pieces, start = [], 0
    for size in chunk_sizes:
        pieces.append(detok.push(ids[start : start + size]))
        start += size
    assert start == len(ids)
    pieces.append(detok.flush())
    return pieces


def test_one_token_at_a_time_equals_full_decode(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    pieces = stream(tokenizer, ids, [1] * len(ids))
    assert "".join(pieces) == TEXT
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)


def test_no_piece_contains_a_replacement_character(tokenizer):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    pieces = stream(tokenizer, ids, [1] * len(ids))
    assert all("\ufffd" not in piece for piece in pieces)


def test_multibyte_character_is_held_until_complete(tokenizer):
    ids = tokenizer.encode("東", add_special_tokens=False)
    assert len(ids) == 3  # three UTF-8 bytes, none of them merged by this tiny vocabulary
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.push([i]) for i in ids] == ["", "", "東"]
    assert detok.flush() == ""


def test_incomplete_character_at_the_end_is_flushed(tokenizer):
    ids = tokenizer.encode("a東", add_special_tokens=False)[:-1]  # cut inside the character
    assert len(ids) == 3
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.push(ids[:1]) == "a"
    assert detok.push(ids[1:]) == ""
    assert detok.flush() == "\ufffd"


def test_a_push_ending_mid_character_is_held_whole(tokenizer):
    # Holding works at push granularity: the "a" of the same push waits with the partial character.
    ids = tokenizer.encode("a東", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.push(ids[:-1]) == ""
    assert detok.push(ids[-1:]) == "a東"
    assert detok.flush() == ""


@pytest.mark.parametrize("seed", range(20))
def test_random_ids_and_chunks_equal_full_decode(tokenizer, seed):
    rng = random.Random(seed)
    vocab = len(tokenizer)
    text_ids = tokenizer.encode(TEXT, add_special_tokens=False)
    # Random ids (any byte, special tokens included) mixed with real multi-byte text.
    ids = [rng.randrange(vocab) for _ in range(rng.randint(0, 40))] + text_ids
    rng.shuffle(ids)
    chunks = []
    while sum(chunks) < len(ids):
        chunks.append(min(rng.randint(0, 4), len(ids) - sum(chunks)))
    for skip in (True, False):
        pieces = stream(tokenizer, ids, chunks, skip_special_tokens=skip)
        assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=skip)


def test_special_tokens_are_skipped_or_kept(tokenizer):
    eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    ids = tokenizer.encode("hi", add_special_tokens=False) + [eos]
    assert "".join(stream(tokenizer, ids, [1] * len(ids))) == "hi"
    assert "".join(stream(tokenizer, ids, [1] * len(ids), skip_special_tokens=False)) == "hi" + tokenizer.eos_token


def test_empty_pushes_and_token_ids(tokenizer):
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.push([]) == ""
    ids = tokenizer.encode("hello", add_special_tokens=False)
    assert detok.push(ids) == "hello"
    assert detok.push([]) == ""
    assert detok.flush() == ""
    assert detok.token_ids == ids


# --- StopMatcher ------------------------------------------------------------------------------------


def feed_all(matcher: StopMatcher, chunks: list[str]) -> list[tuple[str, bool]]:
    return [matcher.feed(chunk) for chunk in chunks]


def test_no_stops_passes_text_through():
    matcher = StopMatcher([])
    assert feed_all(matcher, ["a", "bc"]) == [("a", False), ("bc", False)]
    assert matcher.flush() == ""


def test_no_match_releases_everything():
    matcher = StopMatcher(["STOP"])
    assert feed_all(matcher, ["hello ", "world"]) == [("hello ", False), ("world", False)]
    assert matcher.flush() == ""


def test_stop_inside_one_chunk():
    matcher = StopMatcher(["\n\n"])
    assert matcher.feed("one\n\ntwo") == ("one", True)
    assert matcher.stopped is True
    assert matcher.feed("more") == ("", True)
    assert matcher.flush() == ""


def test_stop_split_across_chunks():
    matcher = StopMatcher(["User:"])
    assert feed_all(matcher, ["fine.\nUs", "e", "r: hi"]) == [("fine.\n", False), ("", False), ("", True)]


def test_stop_at_the_start():
    matcher = StopMatcher(["<end>"])
    assert matcher.feed("<end>after") == ("", True)


def test_held_prefix_that_turns_out_not_to_be_a_stop():
    matcher = StopMatcher(["STOP"])
    assert feed_all(matcher, ["a ST", "O", "P?", "x"]) == [("a ", False), ("", False), ("", True), ("", True)]
    matcher = StopMatcher(["STOP"])
    assert feed_all(matcher, ["a ST", "OR", "Y"]) == [("a ", False), ("STOR", False), ("Y", False)]


def test_held_tail_is_released_by_flush():
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("end ST") == ("end ", False)
    assert matcher.flush() == "ST"
    assert matcher.flush() == ""


def test_earliest_stop_wins():
    matcher = StopMatcher(["bcd", "ab"])
    assert matcher.feed("xabcd") == ("x", True)


def test_overlapping_prefixes():
    # "aab" only matches from the second "a"; the first must be released, not swallowed.
    matcher = StopMatcher(["aab"])
    assert feed_all(matcher, ["a", "a", "a", "b"]) == [("", False), ("", False), ("a", False), ("", True)]
    matcher = StopMatcher(["abab"])
    assert feed_all(matcher, ["ab", "ab", "x"]) == [("", False), ("", True), ("", True)]
    matcher = StopMatcher(["abab"])
    assert feed_all(matcher, ["aba", "cab"]) == [("", False), ("abac", False)]
    assert matcher.flush() == "ab"


def test_shorter_stop_inside_a_longer_candidate():
    matcher = StopMatcher(["hello world", "lo"])
    assert feed_all(matcher, ["hel", "lo"]) == [("", False), ("hel", True)]


def test_multi_character_code_points():
    matcher = StopMatcher(["東京"])
    assert feed_all(matcher, ["in 東", "京 now"]) == [("in ", False), ("", True)]


@pytest.mark.parametrize("seed", range(30))
def test_random_chunking_matches_a_whole_string_search(seed):
    rng = random.Random(seed)
    stops = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
    text = "".join(rng.choice("abc") for _ in range(rng.randint(0, 30)))
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    expected = (text[: min(cuts)], True) if cuts else (text, False)
    matcher = StopMatcher(stops)
    out, stopped, start = "", False, 0
    while start < len(text):
        end = start + rng.randint(1, 5)
        piece, stopped = matcher.feed(text[start:end])
        out += piece
        start = end
    out += matcher.flush()
    assert (out, stopped) == expected, (stops, text)


def test_empty_stop_string_is_a_programming_error():
    with pytest.raises(ValueError, match="non-empty strings"):
        StopMatcher(["ok", ""])
