"""Text where pre-tokenization matters, merge lists no text teaches, and non-UTF-8 bytes.

``pretokenization_texts`` builds text from a grammar of the pieces GPT-2's and the
cl100k-style patterns treat specially (space runs, contractions in any case, digit runs,
the newline family, Unicode white space, other scripts, combining marks, emoji, the
end-of-text text); a chunking difference shows only where a merge spans the disputed
boundary, so ``spanning_merges`` learns merges from whole lines of such text.
``any_merges`` draws merge lists no text would teach, ``spelled_texts`` texts of their
tokens, and ``invalid_utf8`` the ill-formed sequences a UTF-8 decoder must handle
(truncated, overlong, surrogates, above U+10FFFF, lone continuations, C0, C1, F5–FF).
"""
from __future__ import annotations

import random
from functools import lru_cache

from hypothesis import strategies as st

from gptspec.reference import tokenizer as ref

__all__ = ["PIECES", "pretokenization_texts", "spanning_merges", "PRETOKENIZATION_CORPUS",
           "LINES_PATTERN", "any_merges", "spelled_texts", "invalid_utf8", "is_utf8"]

CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")
# Pieces by the pattern alternative (or the boundary between two) they exercise.
PIECES: dict[str, tuple[str, ...]] = {
    "spaces": (" ", "  ", "   ", "    "),
    "whitespace": ("\t", "\t\t", " \t", "\n", "\n\n", "\r\n", "\r", " \n", "\r\n\r\n",
                   "\u00a0", "\u3000", "\u2003", "\x0b", "\x0c", "\x85", "\u2028", "\u1680",
                   "\u205f", "\u3000\u3000", "\u00a0\u00a0", " \u3000", "\u3000 ", "\t\u2003",
                   "\x0b\x0c"),
    "words": ("a", "the", "Word", "CAPS", "x", "naïve", "Straße", "café", "中文", "字",
              "Привет", "ελληνικά", "مرحبا", "ﬁle", "ǅemal", "ʼn"),
    "numbers": ("1", "12", "123", "1234", "2024", "1234567", "٣٤", "²", "Ⅻ", "½", "𝟙𝟚",
                "۱۲۳۴"),
    "punctuation": (".", ",", "!?", "...", "'", "''", "’", "«", "»", "—", "、", "“", "”",
                    "(", ")", "{}", "-", "_", "#", "$", "%", "@", "'x", "’s"),
    "emoji": ("😀", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "1\ufe0f\u20e3", "❤\ufe0f", "😀😀"),
    "marks": ("e\u0301", "\u0301", "\u200d", "\ufeff", "n\u0303"),
    "special": (ref.ENDOFTEXT,),
}


@st.composite
def contractions(draw: st.DrawFn) -> str:
    """An apostrophe and a contraction suffix, each letter in either case (GPT-2's pattern
    matches only the lower-case ones; the cl100k-style pattern any case)."""
    suffix = draw(st.sampled_from(CONTRACTIONS))
    cased = "".join(c.upper() if draw(st.booleans()) else c for c in suffix)
    return draw(st.sampled_from(("'", "’"))) + cased


def pieces(special: bool = False) -> st.SearchStrategy[str]:
    kinds = [k for k in PIECES if special or k != "special"]
    words = st.sampled_from(PIECES["words"])
    return st.one_of(contractions(), st.tuples(words, contractions()).map("".join),
                     st.text("0123456789", min_size=1, max_size=9),
                     *(st.sampled_from(PIECES[k]) for k in kinds))


@st.composite
def pretokenization_texts(draw: st.DrawFn, max_pieces: int = 12,
                          special: bool = False) -> str:
    """A text of up to ``max_pieces`` pieces of the grammar, joined as drawn (so spaces
    come before words, after them and at the end); ``special`` lets the end-of-text
    token's text in."""
    return "".join(draw(st.lists(pieces(special), min_size=1, max_size=max_pieces)))


# Whole lines as training chunks: merges then span every boundary the patterns draw.
LINES_PATTERN = r"[^\n]*\n?"


def _corpus() -> str:
    """A fixed corpus of the grammar's pieces: every piece several times, in every kind
    of neighbourhood (a seeded shuffle), and the contractions in all their cases."""
    rng = random.Random(2024)
    pool = [p for kind, ps in PIECES.items() if kind != "special" for p in ps]
    pool += ["'" + c for c in CONTRACTIONS] + ["'" + c.upper() for c in CONTRACTIONS]
    pool += [" " + w for w in PIECES["words"]] + ["  " + w for w in PIECES["words"][:6]]
    lines = []
    for _ in range(60):
        lines.append("".join(rng.choice(pool) for _ in range(rng.randint(3, 9))) + "\n")
    return "".join(lines)


PRETOKENIZATION_CORPUS = _corpus()


@lru_cache(maxsize=4)
def spanning_merges(vocab_size: int = 640) -> tuple[tuple[int, int], ...]:
    """Merges learned by the reference from the whole lines of the fixed corpus."""
    return tuple(ref.train(PRETOKENIZATION_CORPUS, vocab_size, LINES_PATTERN))


# --- merge lists no text would teach ---------------------------------------------------------


@st.composite
def any_merges(draw: st.DrawFn, alphabet: bytes = b"abc",
               max_merges: int = 12) -> list[tuple[int, int]]:
    """A valid merge list over the bytes of ``alphabet``: each merge joins two tokens
    already defined (bytes of the alphabet or earlier merges), no pair twice. Most are
    not what BPE learns from any text, and an encoder that assumes they are fails on
    them: a merge may spell bytes that byte-ranked BPE (tiktoken's) would split
    otherwise ([(a, b), (b, c), (a, bc)]: the spec encodes "abc" as ab, c; joining by
    byte ranks gives abc), or two merges may spell the same bytes ([(a, a), (aa, a),
    (a, aa)])."""
    merges: list[tuple[int, int]] = []
    for k in range(draw(st.integers(1, max_merges))):
        # a merged token as often as a byte: long tokens overlap, which is where byte
        # ranks and pair ranks part
        tokens = (st.sampled_from(list(alphabet)) if k == 0 else
                  st.sampled_from(list(alphabet)) | st.integers(256, 255 + k))
        merges.append(draw(st.tuples(tokens, tokens).filter(lambda p: p not in merges)))
    return merges


@st.composite
def spelled_texts(draw: st.DrawFn, merges: list[tuple[int, int]], alphabet: bytes = b"abc",
                  max_tokens: int = 8) -> str:
    """A text of the bytes of drawn tokens of ``merges`` (over an ASCII ``alphabet``) and
    spaces: random letters would seldom spell the long tokens whose merges matter."""
    spelling = ref.token_bytes(merges)
    ids = st.sampled_from([*alphabet, ord(" ")]) | st.integers(256, 255 + len(merges))
    return b"".join(spelling[i] for i in draw(st.lists(ids, min_size=1,
                                                       max_size=max_tokens))).decode("ascii")


# --- byte strings that are not UTF-8 -------------------------------------------------------

VALID_CHARACTERS = ("a", " ", "é", "ß", "中", "€", "😀", "\U0010ffff", "\u0800", "\x7f")
# The ill-formed sequences of the Unicode Standard's Table 3-7, by kind.
OVERLONG = (b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xe0\x9f\xbf", b"\xf0\x80\x80\x80",
            b"\xf0\x8f\xbf\xbf")
SURROGATES = (b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xed\xb0\x80", b"\xed\xa0\x80\xed\xb0\x80")
ABOVE_MAX = (b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xf7\xbf\xbf\xbf")


def is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def truncated_characters() -> st.SearchStrategy[bytes]:
    """A multi-byte character cut after 1 … n−1 of its n bytes."""
    return st.sampled_from([c.encode("utf-8")[:k] for c in VALID_CHARACTERS
                            for k in range(1, len(c.encode("utf-8")))])


def ill_formed() -> st.SearchStrategy[bytes]:
    return st.one_of(
        truncated_characters(),
        st.sampled_from(OVERLONG + SURROGATES + ABOVE_MAX),
        st.lists(st.integers(0x80, 0xBF), min_size=1, max_size=3).map(bytes),  # continuation
        st.integers(0xF5, 0xFF).map(lambda b: bytes([b])),  # never in UTF-8
        st.sampled_from((b"\xc0", b"\xc1")),
    )


@st.composite
def invalid_utf8(draw: st.DrawFn, max_pieces: int = 6) -> bytes:
    """Valid characters around at least one ill-formed sequence, sometimes ending in a
    character cut short (a token sequence stopped mid-character)."""
    valid = st.sampled_from(VALID_CHARACTERS).map(lambda c: c.encode("utf-8"))
    parts = draw(st.lists(valid | ill_formed(), max_size=max_pieces))
    parts.insert(draw(st.integers(0, len(parts))), draw(ill_formed()))
    if draw(st.booleans()):
        parts.append(draw(truncated_characters()))
    data = b"".join(parts)
    # a lone continuation byte after a truncated character can complete it
    return data if not is_utf8(data) else data + b"\xff"
