"""Checks that any tokenizer backend must pass, against gptspec.reference.tokenizer.

The suite's backend brings its tokenizer through the optional operation ``tokenizer()``,
returning an object with ``name``, ``train(text, vocab_size, pattern) -> merges`` (no
special tokens) and ``build(merges, pattern, special_tokens) -> tokenizer``, whose
tokenizer has ``encode(text, allowed_special=()) -> list[int]`` (``ValueError`` on a
special token's text not allowed) and ``decode(ids) -> str`` (``ValueError`` on an id
outside the vocabulary). ``gptspec.fast.tokenizer.FastTokenizerBackend`` is one, and a
suite backend of its own (``--backend gptspec.fast.tokenizer:FastTokenizerBackend
--area tokenizer``). Token ids are exact: every comparison here is equality.
"""

from __future__ import annotations

from typing import Any, Protocol

from hypothesis import strategies as st

from gptspec.conformance.protocol import NotApplicable
from gptspec.conformance.registry import check
from gptspec.conformance.text_strategies import (
    LINES_PATTERN,
    any_merges,
    invalid_utf8,
    pretokenization_texts,
    spanning_merges,
    spelled_texts,
)
from gptspec.reference import tokenizer as ref

__all__ = ["TokenizerBackend", "ALPHABETS", "CORPUS", "PATTERNS", "texts"]

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


def _merges(tb: TokenizerBackend, text: str, vocab_size: int, pattern: str) -> list:
    """The backend's merges learned from ``text``; for a backend that does not train
    (its ``train`` raises NotApplicable: tiktoken only encodes), the reference's, so that
    its encoding and decoding are judged all the same (train.matches_reference is then
    not applicable)."""
    try:
        return tb.train(text, vocab_size, pattern)
    except NotApplicable:
        return ref.train(text, vocab_size, pattern)


def _trained(tb: TokenizerBackend, pattern: str, vocab_size: int = 400) -> tuple[Any, int]:
    merges = _merges(tb, CORPUS, vocab_size, pattern)
    eot = 256 + len(merges)
    return tb.build(merges, pattern, {ENDOFTEXT: eot}), eot


def _tokenizer_backend(ctx: Any) -> TokenizerBackend:
    return ctx.op("tokenizer")()


OPS = ("tokenizer",)
EXACT = "exact: token ids and text compared for equality"


@check("decode.round_trip", entries=("decode", "encode"), ops=OPS, kind="property",
       area="tokenizer", budget=EXACT)
def round_trip(backend, ctx):
    """Decoding inverts encoding.

    For every string s of Unicode scalar values (no lone surrogates) and every tokenizer
    — trained with GPT-2's pattern, with the cl100k-style pattern, or the bare 256
    bytes — decode(encode(s)) = s.
    """
    tb = _tokenizer_backend(ctx)
    tokenizers = [_trained(tb, p)[0] for p in PATTERNS]
    tokenizers.append(tb.build([], ref.GPT2_PATTERN, {}))

    @ctx.given(s=st.text(st.characters(exclude_categories=["Cs"])) | texts(),
               which=st.integers(0, 2))
    def _(s, which):
        tok = tokenizers[which]
        ctx.require(tok.decode(tok.encode(s)) == s, f"decode(encode({s!r})) != input")


@check("train.matches_reference", entries=("train", "pair_counts", "best_pair", "merge_pair"),
       ops=OPS, area="tokenizer", budget=EXACT)
def train_matches_reference(backend, ctx):
    """Training learns the reference's merges, in the reference's order.

    For every text over a small alphabet (so that counts tie and pairs overlap), every
    vocabulary size 256 … 300 and both patterns: train(text, V, P) equals the
    reference's merge list exactly, including the tie-break (the smallest pair wins).
    """
    tb = _tokenizer_backend(ctx)

    @ctx.given(text=texts(max_size=60), vocab_size=st.integers(256, 300),
               pattern=st.sampled_from(PATTERNS))
    def _(text, vocab_size, pattern):
        expected = ref.train(text, vocab_size, pattern)
        got = [tuple(m) for m in tb.train(text, vocab_size, pattern)]
        ctx.require(got == expected, f"train({text!r}, {vocab_size}) = {got}, "
                                     f"reference {expected}")


@check("encode.matches_reference", entries=("encode", "bpe_chunk", "pretokenize"),
       ops=OPS, area="tokenizer", budget=EXACT)
def encode_matches_reference(backend, ctx):
    """Encoding gives the reference's tokens.

    For both patterns, three sets of merges and every text drawn below, encoding (the
    end-of-text token configured and allowed) gives exactly the reference's token ids.
    Merges: learned by the reference from a drawn text, and from whole lines of the fixed
    corpus of ``text_strategies``; learned from whole lines (always for the corpus, for
    a drawn text when so drawn), they span the chunk boundaries the pattern draws, so a
    backend that draws a boundary elsewhere gets other tokens. And any valid merge list
    over a few letters (``any_merges``: each merge joins tokens defined before it, no
    pair twice), most of which no text would teach: a merge that byte-ranked BPE would
    not make ([(a, b), (b, c), (a, bc)], where the spec encodes "abc" as ab, c), or two
    merges spelling the same bytes; a backend that ranks pairs by the bytes they spell
    (tiktoken's rule) gets other tokens. A backend that cannot hold such a list (its
    build raises NotApplicable) is judged on the learned merges alone. Texts: from the
    pre-tokenization grammar (runs of spaces, contractions in any case, digit runs, the
    newline family, tabs, Unicode white space, letters, numbers and punctuation of other
    scripts, combining marks, emoji, <|endoftext|>) and over the small alphabets; for
    the drawn merge list, texts made of its tokens' bytes and spaces.
    """
    tb = _tokenizer_backend(ctx)
    grammar = pretokenization_texts(special=True)

    def matches(merges: list[tuple[int, int]], samples: list[str], pattern: str) -> None:
        special = {ENDOFTEXT: 256 + len(merges)}
        tok = tb.build(merges, pattern, special)
        for s in samples:
            expected = ref.encode(s, merges, pattern, special, allowed_special={ENDOFTEXT})
            got = tok.encode(s, allowed_special={ENDOFTEXT})
            ctx.require(got == expected, f"encode({s!r}) = {got}, reference {expected} "
                                         f"(reference chunks {ref.pretokenize(s, pattern)})")

    @st.composite
    def untaught(draw: st.DrawFn) -> tuple[list[tuple[int, int]], list[str]]:
        merges = draw(any_merges())
        return merges, draw(st.lists(spelled_texts(merges), min_size=1, max_size=4))

    @ctx.given(train_text=texts(max_size=60) | pretokenization_texts(max_pieces=30),
               whole_lines=st.booleans(), vocab_size=st.integers(256, 320),
               samples=st.tuples(st.lists(grammar, min_size=1, max_size=3),
                                 st.lists(texts(), max_size=2)).map(lambda t: t[0] + t[1]))
    def _(train_text, whole_lines, vocab_size, samples):
        for pattern in PATTERNS:
            matches(list(spanning_merges()), samples, pattern)
            merges = ref.train(train_text, vocab_size, LINES_PATTERN if whole_lines else pattern)
            matches(merges, samples, pattern)

    # apart, so that the draws above stay what they were
    @ctx.given(any_valid=st.lists(untaught(), min_size=1, max_size=3))
    def _(any_valid):
        for pattern in PATTERNS:
            for untaught_merges, untaught_samples in any_valid:
                try:
                    matches(untaught_merges, untaught_samples, pattern)
                except NotApplicable:
                    pass  # an engine that keys tokens by their bytes cannot hold these
                    # merges (it says so when building): judged on the learned ones alone


@check("bpe_chunk.rank_order", entries=("bpe_chunk",), ops=OPS, area="tokenizer",
       budget=EXACT)
def rank_order(backend, ctx):
    """Merges are applied in rank order, not in text order.

    For distinct letters x, y, z: with merges [(y, z), (x, y)] the chunk x y z encodes
    as x, (y z) = [x, 256]; with [(x, y), (y, z)] as (x y), z = [256, z]. Padded with
    further letters of the same set (one chunk, so only the ranks decide), it encodes as
    the reference does.
    """
    tb = _tokenizer_backend(ctx)

    @ctx.given(xyz=st.lists(st.sampled_from("abcdefgh"), min_size=3, max_size=3, unique=True),
               padding=st.text(st.sampled_from("abcdefgh"), max_size=12))
    def _(xyz, padding):
        x, y, z = (ord(c) for c in xyz)
        s = "".join(xyz)
        for merges, expected in (([(y, z), (x, y)], [x, 256]), ([(x, y), (y, z)], [256, z])):
            tok = tb.build(merges, ref.GPT2_PATTERN, {})
            got = tok.encode(s)
            ctx.require(got == expected, f"merges {merges}: encode({s!r}) = {got}, the merge "
                                         f"of rank 0 must win: {expected}")
            t = padding + s + padding
            ctx.require(tok.encode(t) == ref.encode(t, merges),
                        f"merges {merges}: encode({t!r}) differs from the reference")


@check("split_special.allowed_and_disallowed", entries=("split_special", "encode"), ops=OPS,
       kind="property", area="tokenizer", budget=EXACT)
def special_tokens(backend, ctx):
    """Special tokens as configured.

    With <|endoftext|> configured as id e: encoding a + "<|endoftext|>" + b with it
    allowed gives encode(a) + [e] + encode(b), and decodes back to the text; without it
    allowed, encoding raises ValueError naming the token (the text must not silently
    become ordinary tokens).
    """
    tb = _tokenizer_backend(ctx)
    tok, eot = _trained(tb, ref.GPT2_PATTERN)

    @ctx.given(before=texts(), after=texts())
    def _(before, after):
        text = before + ENDOFTEXT + after
        got = tok.encode(text, allowed_special={ENDOFTEXT})
        expected = tok.encode(before) + [eot] + tok.encode(after)
        ctx.require(got == expected, f"encode({text!r}) = {got}, expected {expected}")
        ctx.require(tok.encode(text, allowed_special="all") == got,
                    "allowed_special='all' differs from allowing the token by name")
        ctx.require(tok.decode(got) == text, f"decode(encode({text!r})) != input")
        try:
            tok.encode(text)
        except ValueError as err:
            ctx.require(ENDOFTEXT in str(err), f"the error must name the token: {err}")
        else:
            ctx.require(False, f"encode({text!r}) with no special token allowed did not raise")


@check("decode.out_of_range", entries=("decode",), ops=OPS, kind="property",
       area="tokenizer", budget=EXACT)
def decode_out_of_range(backend, ctx):
    """An id outside the vocabulary is an error, not garbage text.

    For a tokenizer with ids 0 … e (e = <|endoftext|>), decode([65, t]) raises
    ValueError for every t > e and every t < 0.
    """
    tb = _tokenizer_backend(ctx)
    tok, eot = _trained(tb, ref.GPT2_PATTERN)

    @ctx.given(bad=st.integers(eot + 1, 1 << 40) | st.integers(-(1 << 40), -1))
    def _(bad):
        try:
            tok.decode([65, bad])
        except ValueError:
            raised = True
        else:
            raised = False
        ctx.require(raised, f"decode([65, {bad}]) did not raise ValueError")


@check("decode.invalid_utf8", entries=("decode",), ops=OPS, area="tokenizer", budget=EXACT)
def decode_invalid_utf8(backend, ctx):
    """Token sequences whose bytes are not UTF-8 decode to the reference's text.

    The spec (entry ``decode``) replaces each maximal subpart of an ill-formed byte
    sequence by one U+FFFD and keeps every well-formed character. For every byte string
    b of valid characters around at least one ill-formed sequence (a character cut
    short, also at the very end; an overlong form; an encoded surrogate; a code point
    above U+10FFFF; lone continuation bytes; C0, C1, F5–FF): the byte tokens of b decode,
    with the bare 256-byte tokenizer, to exactly the reference's text; and with a trained
    tokenizer (whose tokens include parts of characters), the same byte tokens with
    drawn tokens of its vocabulary (<|endoftext|> included) spliced in decode to exactly
    the reference's text of the same ids.
    """
    tb = _tokenizer_backend(ctx)
    bare = tb.build([], ref.GPT2_PATTERN, {})
    merges = _merges(tb, CORPUS, 400, ref.GPT2_PATTERN)
    eot = 256 + len(merges)
    special = {ENDOFTEXT: eot}
    trained = tb.build(merges, ref.GPT2_PATTERN, special)

    @ctx.given(data=invalid_utf8(),
               spliced=st.lists(st.tuples(st.integers(0, 64), st.integers(0, eot)),
                                max_size=4))
    def _(data, spliced):
        ids = list(data)
        got = bare.decode(ids)
        expected = ref.decode(ids, [])
        ctx.require(got == expected, f"decode of the bytes {data!r} = {got!r}, reference "
                                     f"{expected!r}")
        for at, token in spliced:
            ids.insert(min(at, len(ids)), token)
        got = trained.decode(ids)
        expected = ref.decode(ids, merges, special)
        ctx.require(got == expected, f"trained tokenizer: decode({ids}) = {got!r}, "
                                     f"reference {expected!r}")


@check("token_bytes.concatenation", entries=("byte_tokens", "token_bytes"), ops=OPS,
       kind="property", area="tokenizer", budget=EXACT)
def token_bytes_concatenation(backend, ctx):
    """Token ids denote byte strings, and a text's tokens spell its bytes.

    (1) With no merges, the tokens of s are its UTF-8 bytes: encode(s) = list(utf8(s))
        (the base vocabulary: token i is byte i).
    (2) For a trained tokenizer with merges m, the bytes of its tokens, bytes(t) defined
        by token_bytes(m), concatenate to utf8(s): ‖_t bytes(t) = utf8(s).
    """
    tb = _tokenizer_backend(ctx)
    merges = _merges(tb, CORPUS, 400, ref.GPT2_PATTERN)
    table = ref.token_bytes(merges)
    trained = tb.build(merges, ref.GPT2_PATTERN, {})
    bare = tb.build([], ref.GPT2_PATTERN, {})

    @ctx.given(s=st.text(st.characters(exclude_categories=["Cs"])) | texts())
    def _(s):
        data = s.encode("utf-8")
        ids = list(bare.encode(s))
        ctx.require(ids == list(data), f"byte-level encode({s!r}) = {ids} != its bytes")
        spelled = b"".join(table[t] for t in trained.encode(s))
        ctx.require(spelled == data, f"the tokens of {s!r} spell {spelled!r}, not {data!r}")


@check("bytes_to_unicode.alphabet", entries=("bytes_to_unicode",), ops=OPS, kind="property",
       area="tokenizer", budget=EXACT)
def bytes_to_unicode_alphabet(backend, ctx):
    """GPT-2's printable byte alphabet, as the backend writes it into tokenizer files.

    The map φ used by the tokenizer backend's files (its ``bytes_to_unicode()``) equals the
    spec's: a bijection from the 256 byte values onto 256 printable, non-space characters,
    the identity on the printable ranges [33, 126], [161, 172] and [174, 255], and the
    remaining bytes sent in order to chr(256), chr(257), …
    """
    tb = _tokenizer_backend(ctx)
    phi_of = getattr(tb, "bytes_to_unicode", None)
    if phi_of is None:
        from gptspec.conformance.context import NotImplementedOp

        raise NotImplementedOp("tokenizer().bytes_to_unicode")
    phi = dict(phi_of())
    expected = ref.bytes_to_unicode()
    ctx.require(sorted(phi) == list(range(256)), "φ is not defined on exactly the 256 bytes")
    ctx.require(len(set(phi.values())) == 256, "φ is not one to one")

    @ctx.given(b=st.integers(0, 255))
    def _(b):
        c = phi[b]
        ctx.require(c.isprintable() and not c.isspace(),
                    f"φ({b}) = {c!r} is not a printable non-space character")
        ctx.require(c == expected[b], f"φ({b}) = {c!r}, the spec's is {expected[b]!r}")
