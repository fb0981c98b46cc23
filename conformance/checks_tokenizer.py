"""Checks that any tokenizer backend must pass, against gptspec.reference.tokenizer.

A tokenizer backend is any object with

- ``name`` (a string);
- ``train(text, vocab_size, pattern) -> merges``: the merges learned (the reference's
  ``train``, no special tokens);
- ``build(merges, pattern, special_tokens) -> tokenizer``, where the tokenizer has
  ``encode(text, allowed_special=()) -> list[int]`` (raising ``ValueError`` on special
  tokens' text that is not allowed) and ``decode(ids) -> str`` (``ValueError`` on an id
  outside the vocabulary).

``gptspec.fast.tokenizer.FastTokenizerBackend`` adapts the fast ``Tokenizer``. Each
check is a function ``check(backend, settings=None)`` that raises ``AssertionError``
(with a Hypothesis counterexample) when the backend is wrong; ``settings`` is a
``hypothesis.settings`` for its examples. ``CHECKS`` lists them by id with the spec
entries they cover.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from gptspec.reference import tokenizer as ref
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

__all__ = ["TokenizerBackend", "CHECKS", "check_roundtrip", "check_train_matches_reference",
           "check_encode_matches_reference", "check_rank_order", "check_special_tokens",
           "check_decode_out_of_range"]

ENDOFTEXT = ref.ENDOFTEXT


class TokenizerBackend(Protocol):
    name: str

    def train(self, text: str, vocab_size: int, pattern: str) -> list[tuple[int, int]]: ...

    def build(self, merges: list[tuple[int, int]], pattern: str,
              special_tokens: dict[str, int]) -> Any: ...


# Small alphabets make merges compete (repeats, overlaps, ties); the mixed one brings
# multi-byte characters, digits and every kind of whitespace into the chunks.
ALPHABETS = ("ab", "ab ", "aab c\n", "xyz  .,'", "hello wörld 12 \t\n\n😀中文'sllve")
# A corpus that the round-trip and special-token checks train on.
CORPUS = ("The quick brown fox jumps over the lazy dog. It's 2024; we'll see 1234567 "
          "numbers, naïve café, 中文字符, emoji 😀😀 and\ttabs\n\n  indented code(x) {}\n") * 3

PATTERNS = (ref.GPT2_PATTERN, ref.CL100K_PATTERN)


@st.composite
def texts(draw: st.DrawFn, max_size: int = 40) -> str:
    alphabet = draw(st.sampled_from(ALPHABETS))
    return draw(st.text(alphabet=alphabet, max_size=max_size))


def _run(test: Callable[..., None], settings: hypothesis_settings | None) -> None:
    (settings(test) if settings is not None else test)()


def _trained(backend: TokenizerBackend, pattern: str, vocab_size: int = 400) -> Any:
    merges = backend.train(CORPUS, vocab_size, pattern)
    eot = 256 + len(merges)
    return backend.build(merges, pattern, {ENDOFTEXT: eot}), eot


def check_roundtrip(backend: TokenizerBackend, settings: hypothesis_settings | None = None
                    ) -> None:
    """decode(encode(s)) == s for every string s (any Unicode, not only the corpus')."""
    tokenizers = [_trained(backend, p)[0] for p in PATTERNS]
    tokenizers.append(backend.build([], ref.GPT2_PATTERN, {}))

    @given(st.text(st.characters(exclude_categories=["Cs"])) | texts(), st.integers(0, 2))
    def test(s: str, which: int) -> None:
        tok = tokenizers[which]
        ids = tok.encode(s)
        assert tok.decode(ids) == s, f"{backend.name}: decode(encode({s!r})) != input"

    _run(test, settings)


def check_train_matches_reference(backend: TokenizerBackend,
                                  settings: hypothesis_settings | None = None) -> None:
    """The backend learns exactly the reference's merges, in the same order."""

    @given(texts(max_size=60), st.integers(256, 300), st.sampled_from(PATTERNS))
    def test(text: str, vocab_size: int, pattern: str) -> None:
        expected = ref.train(text, vocab_size, pattern)
        got = [tuple(m) for m in backend.train(text, vocab_size, pattern)]
        assert got == expected, f"{backend.name}: train({text!r}, {vocab_size}) differs"

    _run(test, settings)


def check_encode_matches_reference(backend: TokenizerBackend,
                                   settings: hypothesis_settings | None = None) -> None:
    """With merges learned from one text, the backend encodes other texts exactly as the
    reference does."""

    @given(texts(max_size=60), st.lists(texts(), min_size=1, max_size=4),
           st.integers(256, 320), st.sampled_from(PATTERNS))
    def test(train_text: str, samples: list[str], vocab_size: int, pattern: str) -> None:
        merges = ref.train(train_text, vocab_size, pattern)
        tok = backend.build(merges, pattern, {})
        for s in samples:
            expected = ref.encode(s, merges, pattern)
            assert tok.encode(s) == expected, f"{backend.name}: encode({s!r}) differs"

    _run(test, settings)


def check_rank_order(backend: TokenizerBackend, settings: hypothesis_settings | None = None
                     ) -> None:
    """Where two merges compete for a byte, the one of lower rank wins, wherever it is:
    with merges [(y, z), (x, y)] the text x y z encodes as x, (y z); with the order
    reversed, as (x y), z."""

    @given(st.lists(st.sampled_from("abcdefgh"), min_size=3, max_size=3, unique=True),
           st.text(st.sampled_from("abcdefgh"), max_size=12))
    def test(xyz: list[str], padding: str) -> None:
        x, y, z = (ord(c) for c in xyz)
        later_first = backend.build([(y, z), (x, y)], ref.GPT2_PATTERN, {})
        earlier_first = backend.build([(x, y), (y, z)], ref.GPT2_PATTERN, {})
        # letters only: one chunk, so only the ranks decide
        s = "".join(xyz)
        assert later_first.encode(s) == [x, 256], f"{backend.name}: rank 0 (y z) must win"
        assert earlier_first.encode(s) == [256, z], f"{backend.name}: rank 0 (x y) must win"
        for tok, merges in ((later_first, [(y, z), (x, y)]), (earlier_first, [(x, y), (y, z)])):
            t = padding + s + padding
            assert tok.encode(t) == ref.encode(t, merges), f"{backend.name}: encode({t!r})"

    _run(test, settings)


def check_special_tokens(backend: TokenizerBackend, settings: hypothesis_settings | None = None
                         ) -> None:
    """An allowed special token's text becomes its id, the text around it is encoded as
    usual; special-token text that is not allowed raises ValueError naming the token."""
    tok, eot = _trained(backend, ref.GPT2_PATTERN)

    @given(texts(), texts())
    def test(before: str, after: str) -> None:
        text = before + ENDOFTEXT + after
        got = tok.encode(text, allowed_special={ENDOFTEXT})
        assert got == tok.encode(before) + [eot] + tok.encode(after), f"{backend.name}: {text!r}"
        assert tok.encode(text, allowed_special="all") == got
        assert tok.decode(got) == text
        try:
            tok.encode(text)
        except ValueError as err:
            assert ENDOFTEXT in str(err), f"{backend.name}: the error must name the token"
        else:
            raise AssertionError(f"{backend.name}: disallowed special text was encoded")

    _run(test, settings)


def check_decode_out_of_range(backend: TokenizerBackend,
                              settings: hypothesis_settings | None = None) -> None:
    """An id outside the vocabulary is a ValueError, not garbage text."""
    tok, eot = _trained(backend, ref.GPT2_PATTERN)

    @given(st.integers(eot + 1, 1 << 40) | st.integers(-(1 << 40), -1))
    def test(bad: int) -> None:
        try:
            tok.decode([65, bad])
        except ValueError:
            return
        raise AssertionError(f"{backend.name}: decode([65, {bad}]) did not raise")

    _run(test, settings)


# check id → (spec entries covered, function)
CHECKS: dict[str, tuple[tuple[str, ...], Callable[..., None]]] = {
    "decode.roundtrip": (("decode", "encode"), check_roundtrip),
    "train.matches_reference": (("train", "pair_counts", "best_pair", "merge_pair"),
                                check_train_matches_reference),
    "encode.matches_reference": (("encode", "bpe_chunk", "pretokenize"),
                                 check_encode_matches_reference),
    "bpe_chunk.rank_order": (("bpe_chunk",), check_rank_order),
    "split_special.allowed_and_disallowed": (("split_special", "encode"), check_special_tokens),
    "decode.out_of_range": (("decode",), check_decode_out_of_range),
}
