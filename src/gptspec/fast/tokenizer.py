"""The byte-level BPE tokenizer people use: same maps as the reference, fast.

Training updates pair counts incrementally (a merge recounts only the distinct chunks
holding its pair; a heap on (−count, pair) gives the spec's tie-break). Encoding goes
through tiktoken, built offline from the merges' ranks, where that is the spec's map:
tiktoken ranks a pair by its bytes, right only for merges byte-ranked BPE itself makes
(merges_follow_byte_ranks, tested when the tokenizer is built). Other merges run the
spec's algorithm in O(n log n) per chunk (a heap over adjacent pairs), cached per chunk.
GPT-2's pattern runs lookahead-free on pieces cut where the two forms differ (tiktoken's
regex engine is slow on lookahead), and a long text may use several threads.
"""
from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import regex
import tiktoken

from gptspec.reference.tokenizer import (
    CL100K_PATTERN,
    ENDOFTEXT,
    GPT2_PATTERN,
    IDENTITY_BASE,
    PATTERNS,
    Pair,
)

__all__ = ["Tokenizer", "TokenizerError", "FastTokenizerBackend", "train_merges",
           "bpe_lowest_rank_first", "split_for_threads", "cut_whitespace_runs",
           "resolve_pattern", "GPT2_PATTERN",
           "GPT2_NO_LOOKAHEAD", "CL100K_PATTERN", "ENDOFTEXT", "MAX_VOCAB_SIZE", "WHITE_SPACE"]

# Far beyond any BPE vocabulary in use (cl100k ≈ 100k, o200k ≈ 200k); a larger request
# is a typo, and would mostly learn merges of count 1.
MAX_VOCAB_SIZE = 1 << 21

# A tokenizer file is untrusted input: its merges name earlier tokens, so a few bytes of
# file can describe tokens of any length (each merge may double the last). The bytes of
# all tokens together are capped, and counted before any token is built, so loading costs
# time and memory linear in this cap. GPT-2's and cl100k's vocabularies hold < 1 MiB.
MAX_VOCAB_BYTES = 16 << 20
# Whether tiktoken may encode for a vocabulary is decided by replaying BPE over each
# token's bytes (merges_follow_byte_ranks): time ∝ the sum of squared token lengths, here
# capped (GPT-2's vocabulary: a few million). Past it, encoding takes the exact path.
MAX_CONSISTENCY_WORK = 1 << 25
SHORT_TOKEN = 24  # bytes, up to which that replay rescans the pieces (cheaper than a heap)

# The `regex` module backtracks, so a pattern can take exponential time on the wrong text
# ((?:a|a)*b on a run of a's). tiktoken's engine, which encoding goes through, is linear
# for a pattern without look-around or back-references. Where a pattern runs in `regex`
# (the probe below, training's chunk counts, the encoder for merges tiktoken cannot hold)
# it gets a second plus 10 µs per character: some 50 times what GPT-2's and cl100k's
# patterns take (≈ 0.15 µs per character of source code).
REGEX_SECONDS = 1.0
REGEX_SECONDS_PER_CHAR = 1e-5

# A probe of every kind of character a pre-tokenization pattern must cover: a pattern
# that skips any of them would make encode → decode lose text.
_PATTERN_PROBE = ("Hello, world! It's 2024: x=3.5e-2 -- 'quoted' \"dq\"\t\ttabs\n\n"
                  "  spaces   \u00e9t\u00e9 \u65e5\u672c\u8a9e \U0001f600 _under_score "
                  "\u0000\u00a0\u2028 end ")

# Pieces below this many characters are not worth a thread.
PARALLEL_MIN_PIECE = 1 << 17
# The patterns whose chunks never hold a non-space followed by a space (see below).
SPLITTABLE = (GPT2_PATTERN, CL100K_PATTERN)


def split_for_threads(text: str, n: int) -> list[str]:
    """Cut text into about n pieces, each cut just before a space that follows a printable
    ASCII character. For GPT-2's and the cl100k-style pattern such a place is a chunk
    boundary: no alternative matches a non-space followed by a space; and chunking
    each side on its own gives the same chunks, as the patterns look neither behind a
    position nor, from a match that ends before the cut, past a non-space."""
    cuts = [0]
    for i in range(1, n):
        p = text.find(" ", max(cuts[-1] + 1, len(text) * i // n))
        while p > 0 and not ("!" <= text[p - 1] <= "~"):
            p = text.find(" ", p + 1)
        if p <= 0:
            break
        cuts.append(p)
    cuts.append(len(text))
    return [text[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]


# GPT-2's pattern with its last two alternatives, \s+(?!\S) and \s+, made one: \s+.
# They differ only on a run of two or more whitespace characters followed by a
# non-space, which GPT-2's pattern splits before its last character. Cut the text there
# (cut_whitespace_runs) and the two patterns give the same chunks, piece by piece; and
# without a lookahead, tiktoken's regex engine takes its fast path.
GPT2_NO_LOOKAHEAD = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+"""
# The characters \s matches (Unicode's White_Space, in the `regex` module and in
# tiktoken's engine alike); none lies above U+3000.
WHITE_SPACE = (0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
               0x2028, 0x2029, 0x202F, 0x205F, 0x3000)
_IS_SPACE = np.zeros(0x3002, dtype=bool)  # index 0x3001 stands for every larger code point
_IS_SPACE[list(WHITE_SPACE)] = True


def cut_whitespace_runs(text: str) -> list[str]:
    """Cut text before the last character of each whitespace run of length ≥ 2 that a
    non-space follows (vectorized: a regex scan would cost what the cut saves)."""
    if len(text) < 3:
        return [text]
    if text.isascii():
        space = _IS_SPACE[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]
    else:
        points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        space = _IS_SPACE[np.minimum(points, 0x3001)]
    cuts = (np.flatnonzero(space[:-2] & space[1:-1] & ~space[2:]) + 1).tolist()
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


class TokenizerError(ValueError):
    """A tokenizer that cannot be built, or input it cannot encode or decode."""


def resolve_pattern(pattern: str) -> str:
    """'gpt2' and 'cl100k' name the two patterns of the spec; any other string is a
    regex of the `regex` module, checked here so that a typo fails at once. Beside the
    spec's two, a pattern may not use look-around or back-references: tiktoken would run
    it on a backtracking engine, where a hostile text costs unbounded time (or a panic
    past its step limit)."""
    if pattern in PATTERNS:
        return PATTERNS[pattern]
    if not pattern:
        raise TokenizerError("the pre-tokenization pattern is empty")
    try:
        compiled = regex.compile(pattern)
    except (regex.error, RecursionError, OverflowError) as err:
        raise TokenizerError(f"pre-tokenization pattern does not compile: {err}") from None
    if compiled.groups:
        raise TokenizerError("the pre-tokenization pattern has capture groups, which change "
                             "what findall returns; write (?:…) instead")
    construct = None if pattern in PATTERNS.values() else backtracking_construct(pattern)
    if construct:
        raise TokenizerError(f"the pre-tokenization pattern uses {construct}, which only a "
                             "backtracking engine can run (unbounded time on a hostile "
                             "text); only the spec's gpt2 and cl100k patterns may")
    if compiled.search("") is not None or "" in findall_within_budget(compiled, _PATTERN_PROBE):
        # an empty chunk encodes to nothing, and engines disagree on where the next match
        # starts after one: tiktoken's panicked on such a pattern
        raise TokenizerError("the pre-tokenization pattern can match the empty string; every "
                             "alternative must take at least one character (+, not *)")
    check_pattern_covers(pattern, _PATTERN_PROBE, sample=True)
    try:  # encoding runs the pattern in tiktoken's regex engine, which must accept it too
        tiktoken.Encoding("probe", pat_str=pattern, mergeable_ranks={bytes([b]): b
                                                                    for b in range(256)},
                          special_tokens={})
    except ValueError as err:
        first = str(err).splitlines()[0] if str(err) else "rejected"
        raise TokenizerError(f"tiktoken cannot compile the pre-tokenization pattern: "
                             f"{first}") from None
    return pattern


def backtracking_construct(pattern: str) -> str | None:
    """The first construct of ``pattern`` that needs a backtracking engine (look-around,
    a back-reference, an atomic group, a possessive quantifier, a conditional), or None.
    Escapes and character classes are stepped over, so ``[(?=]`` and ``\\p{L}+`` are
    not taken for one."""
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            follower = pattern[i + 1:i + 2]
            if follower and (follower in "123456789gkGK"):
                return f"the escape \\{follower} (a back-reference or anchor)"
            if follower in ("p", "P", "N", "x", "u", "U") and pattern[i + 2:i + 3] == "{":
                end = pattern.find("}", i)
                i = n if end < 0 else end + 1
            else:
                i += 2
            continue
        if c == "[":  # a class: up to its closing bracket (a ] first in it is literal)
            i += 2 if pattern[i + 1:i + 2] == "^" else 1
            i += 1 if pattern[i:i + 1] == "]" else 0
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
            i += 1
            continue
        for opening, name in (("(?=", "a look-ahead"), ("(?!", "a look-ahead"),
                              ("(?<=", "a look-behind"), ("(?<!", "a look-behind"),
                              ("(?>", "an atomic group"), ("(?P=", "a back-reference"),
                              ("(?(", "a conditional")):
            if pattern.startswith(opening, i):
                return f"{name} ({opening}…)"
        if c in "*+?}" and pattern[i + 1:i + 2] == "+":
            return f"a possessive quantifier ({c}+)"
        i += 1
    return None


def findall_within_budget(compiled: Any, text: str) -> list[str]:
    """``compiled.findall(text)`` in the `regex` module, refused past REGEX_SECONDS plus
    REGEX_SECONDS_PER_CHAR per character (see there)."""
    budget = REGEX_SECONDS + REGEX_SECONDS_PER_CHAR * len(text)
    try:
        return compiled.findall(text, timeout=budget)
    except TimeoutError:
        raise TokenizerError(f"the pre-tokenization pattern took more than {budget:.3g} s on "
                             f"{len(text):,} characters: it backtracks without bound on "
                             "this text") from None


def check_pattern_covers(pattern: str, text: str, sample: bool = False) -> None:
    """Refuse a pattern whose chunks do not spell ``text`` whole: text it skips would be
    dropped by encoding, silently. ``sample``: ``text`` is gptspec's own probe
    (_PATTERN_PROBE), not the user's, and the line says so."""
    pieces = findall_within_budget(regex.compile(pattern), text)
    if "".join(pieces) != text:
        covered, resumes = 0, len(text)
        for piece in pieces:
            where = text.find(piece, covered)
            if where != covered:  # the gap ends where the next match begins
                resumes = where if where > covered else resumes
                break
            covered += len(piece)
        skipped = text[covered:min(resumes, covered + 12)]
        if sample:  # the character named is the probe's, not the training text's
            where_said = (f"on the sample text gptspec tries every pattern on "
                          f"({text[:13]!r}…), no match covers character {covered} "
                          f"({skipped!r})")
        else:
            where_said = f"in the training text no match covers {skipped!r}"
        raise TokenizerError(f"the pre-tokenization pattern skips text, which encoding "
                             f"would drop: {where_said}; it must match every character")


def check_vocab_size(vocab_size: int, n_special: int = 0) -> None:
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool):
        raise TokenizerError(f"vocab size must be an integer, got {vocab_size!r}")
    if vocab_size < 256 + n_special:
        raise TokenizerError(
            f"vocab size {vocab_size} is below 256 byte tokens + {n_special} special tokens")
    if vocab_size > MAX_VOCAB_SIZE:
        raise TokenizerError(f"vocab size {vocab_size} is absurdly large (limit {MAX_VOCAB_SIZE})")


def _chunk_counts(text: str, pattern: str, special_tokens: Collection[str]) -> Counter[str]:
    pieces = [text]
    for special in special_tokens:
        pieces = [part for piece in pieces for part in piece.split(special)]
    compiled = regex.compile(pattern)
    counts: Counter[str] = Counter()
    for piece in pieces:
        counts.update(findall_within_budget(compiled, piece))
    if sum(len(chunk) * n for chunk, n in counts.items()) != sum(map(len, pieces)):
        for piece in pieces:  # name the first text the pattern skips
            check_pattern_covers(pattern, piece)
    return counts


def train_merges(text: str, n_merges: int, pattern: str = GPT2_PATTERN,
                 special_tokens: Collection[str] = (),
                 progress: Callable[[int], None] | None = None) -> list[Pair]:
    """The reference's ``train``, with incremental pair counts (same merges, same order).

    ``progress(k)`` is called after each merge with the number learned so far."""
    words: list[list[int]] = []
    freqs: list[int] = []
    for chunk, mult in _chunk_counts(text, pattern, special_tokens).items():
        data = chunk.encode("utf-8")
        if len(data) > 1:  # a one-byte chunk has no pair, now or later
            words.append(list(data))
            freqs.append(mult)

    counts: dict[Pair, int] = {}
    where: dict[Pair, set[int]] = {}  # pair → chunks that contained it (may be stale)
    for w, word in enumerate(words):
        mult = freqs[w]
        for pair in zip(word, word[1:], strict=False):
            counts[pair] = counts.get(pair, 0) + mult
            where.setdefault(pair, set()).add(w)
    heap = [(-c, pair) for pair, c in counts.items()]
    heapq.heapify(heap)

    merges: list[Pair] = []
    while len(merges) < n_merges and heap:
        neg, pair = heapq.heappop(heap)
        count = counts.get(pair, 0)
        if count != -neg:
            # stale: counts only rise through a push, so this one fell since its push;
            # put it back at its current count (ties between equal counts still go to
            # the smaller pair, since every entry is ≥ the pair's count)
            if count > 0:
                heapq.heappush(heap, (-count, pair))
            continue
        new = 256 + len(merges)
        merges.append(pair)
        a, b = pair
        risen: set[Pair] = set()
        for w in where.pop(pair):
            word = words[w]
            n = len(word)
            starts = []  # where the pair occurs, left to right, without overlaps
            j = 0
            while j < n - 1:
                if word[j] == a and word[j + 1] == b:
                    starts.append(j)
                    j += 2
                else:
                    j += 1
            if not starts:  # stale membership: the pair left this chunk earlier
                continue
            mult = freqs[w]
            # old pairs that touch a merged position lose this chunk's count
            gone = {i for p in starts for i in (p - 1, p, p + 1) if 0 <= i < n - 1}
            for i in gone:
                old = (word[i], word[i + 1])
                counts[old] -= mult
            out: list[int] = []
            j = 0
            for p in starts:
                out += word[j:p]
                out.append(new)
                j = p + 2
            out += word[j:]
            # new pairs are exactly those with the new token on one side
            for i in range(len(out) - 1):
                if out[i] == new or out[i + 1] == new:
                    q = (out[i], out[i + 1])
                    counts[q] = counts.get(q, 0) + mult
                    risen.add(q)
                    where.setdefault(q, set()).add(w)
            words[w] = out
        for q in risen:
            heapq.heappush(heap, (-counts[q], q))
        counts.pop(pair, None)
        if progress is not None:
            progress(len(merges))
    return merges


def _merge_bytes(merges: Sequence[Pair], base: Sequence[int]) -> list[bytes]:
    if len(merges) > MAX_VOCAB_SIZE:
        raise TokenizerError(f"{len(merges)} merges: more than the limit of {MAX_VOCAB_SIZE}")
    lengths = [1] * 256  # first the lengths alone: the cap is checked before any token exists
    total = 256
    for k, (a, b) in enumerate(merges):
        if not (0 <= a < 256 + k and 0 <= b < 256 + k):
            raise TokenizerError(f"merge {k} = ({a}, {b}) uses a token that is not defined yet")
        lengths.append(lengths[a] + lengths[b])
        total += lengths[-1]
        if total > MAX_VOCAB_BYTES:
            raise TokenizerError(f"the tokens up to merge {k} spell more than "
                                 f"{MAX_VOCAB_BYTES >> 20} MiB together (the limit for a "
                                 "vocabulary)")
    vocab = [bytes([b]) for b in base]
    for a, b in merges:
        vocab.append(vocab[a] + vocab[b])
    return vocab


def lowest_rank_first(symbols: Sequence[Any], rank_of: Callable[[Any, Any], int | None],
                      join: Callable[[Any, Any, int], Any]) -> list[Any]:
    """BPE as the spec runs it: while some adjacent pair has a rank, join the leftmost
    occurrence of the lowest-ranked one (``rank_of(x, y)``: the pair's rank or None;
    ``join(x, y, rank)``: the symbol they become). O(n log n), not the spec's O(n²): the
    symbols form a linked list, and a heap holds (rank, position) for each ranked
    adjacent pair. A position is that of the pair's left symbol in the input, so among
    equal ranks the heap gives the leftmost, as the spec does. An entry whose pair
    changed after it was pushed (a neighbour joined, or its left symbol was absorbed) is
    skipped when popped: the pair that replaced it was pushed when it formed. A rank
    names one pair, so a popped entry is current exactly when its pair still has it."""
    n = len(symbols)
    if n < 2:
        return list(symbols)
    current = list(symbols)
    following = list(range(1, n + 1))  # n: the end; -1: absorbed into its left neighbour
    preceding = list(range(-1, n - 1))  # -1: the start
    heap = [(k, j) for j in range(n - 1)
            if (k := rank_of(current[j], current[j + 1])) is not None]
    heapq.heapify(heap)
    while heap:
        k, left = heapq.heappop(heap)
        right = following[left]
        if right < 0 or right == n or rank_of(current[left], current[right]) != k:
            continue
        current[left] = join(current[left], current[right], k)
        after = following[right]
        following[right] = -1
        following[left] = after
        if after < n:
            preceding[after] = left
            if (k := rank_of(current[left], current[after])) is not None:
                heapq.heappush(heap, (k, left))
        before = preceding[left]
        if before >= 0 and (k := rank_of(current[before], current[left])) is not None:
            heapq.heappush(heap, (k, before))
    out: list[Any] = []
    j = 0  # the first symbol has no left neighbour, so it is never absorbed
    while j < n:
        out.append(current[j])
        j = following[j]
    return out


def bpe_lowest_rank_first(ids: Sequence[int], rank: Mapping[Pair, int]) -> list[int]:
    """The spec's bpe_chunk on token ids, given its rank table {pair: k}."""
    return lowest_rank_first(ids, lambda x, y: rank.get((x, y)), lambda x, y, k: 256 + k)


def merges_follow_byte_ranks(vocab: Sequence[bytes], merges: Sequence[Pair],
                             max_work: int = MAX_CONSISTENCY_WORK) -> bool:
    """Whether tiktoken's BPE gives the spec's tokens for these merges. tiktoken ranks a
    pair of adjacent pieces by the token their joined bytes spell, whichever two tokens
    spell it; the spec ranks only the pair each merge names. They agree when every
    merge is the one byte-ranked BPE itself ends with: BPE over token 256 + k's bytes,
    allowed only tokens below it, leaves exactly merge k's pair (true of merges learned
    by BPE; not of [(a, b), (b, c), (a, bc)], whose "abc" byte ranks make of (ab, c)).
    Token bytes must be distinct. False, too, when the test would cost more than
    ``max_work`` (the sum of the squared lengths of the tokens it replays): the spec's
    own encoder is right for every vocabulary, only slower."""
    if sum(len(data) ** 2 for data in vocab[256:]) > max_work:
        return False
    ranks = {data: i for i, data in enumerate(vocab)}
    for k, (a, b) in enumerate(merges):
        data = vocab[256 + k]
        if len(data) == 2:  # two single bytes: no other way to spell it
            continue
        limit = 256 + k

        def rank_below(x: bytes, y: bytes, limit: int = limit) -> int | None:
            r = ranks.get(x + y)
            return r if r is not None and r < limit else None

        pieces = [data[i:i + 1] for i in range(len(data))]
        if len(data) > SHORT_TOKEN:
            pieces = lowest_rank_first(pieces, rank_below, lambda x, y, _: x + y)
        while len(pieces) > 2:  # a short token: rescanning costs less than a heap
            best, at = limit, -1
            for j in range(len(pieces) - 1):
                r = ranks.get(pieces[j] + pieces[j + 1], limit)
                if r < best:
                    best, at = r, j
            if at < 0:
                return False
            pieces[at:at + 2] = [pieces[at] + pieces[at + 1]]
        if pieces != [vocab[a], vocab[b]]:
            return False
    return True


class Tokenizer:
    """Byte-level BPE: ``merges`` (merge k makes token 256 + k), a pre-tokenization
    ``pattern``, ``special_tokens`` (text → id) and ``base`` (the byte of each of the
    first 256 tokens; the identity unless the vocabulary came from elsewhere)."""

    def __init__(self, merges: Sequence[Pair], pattern: str = GPT2_PATTERN,
                 special_tokens: Mapping[str, int] | None = None,
                 base: Sequence[int] = IDENTITY_BASE, name: str = "gptspec") -> None:
        if not all(isinstance(b, (int, np.integer)) and not isinstance(b, bool) for b in base):
            raise TokenizerError("base must list 256 byte values as integers")
        base = tuple(int(b) for b in base)
        if sorted(base) != list(range(256)):
            raise TokenizerError("base must list each of the 256 byte values exactly once")
        self.merges: list[Pair] = [(int(a), int(b)) for a, b in merges]
        if len(set(self.merges)) != len(self.merges):
            # a repeated pair can never apply (the first has merged every occurrence), yet
            # it takes an id, and encoding would rank the pair by its last copy
            seen: dict[Pair, int] = {}
            for k, pair in enumerate(self.merges):
                if pair in seen:
                    raise TokenizerError(f"merge {k} = {pair} repeats merge {seen[pair]}")
                seen[pair] = k
        self.pattern = resolve_pattern(pattern)
        self.base = base
        self.special_tokens: dict[str, int] = dict(special_tokens or {})
        self._vocab = _merge_bytes(self.merges, base)
        n = len(self._vocab)
        if not all(isinstance(s, str) and isinstance(i, int) and not isinstance(i, bool)
                   for s, i in self.special_tokens.items()):
            raise TokenizerError("special tokens must map text to integer ids, got "
                                 f"{str(self.special_tokens)[:80]}")
        if any(i > MAX_VOCAB_SIZE for i in self.special_tokens.values()):
            raise TokenizerError(f"a special token id is above the vocabulary limit "
                                 f"{MAX_VOCAB_SIZE}")
        ids = sorted(self.special_tokens.values())
        if any(not isinstance(i, int) or i < n for i in ids) or len(set(ids)) != len(ids):
            raise TokenizerError(
                f"special token ids must be distinct integers ≥ {n} (after the BPE tokens), "
                f"got {self.special_tokens}")
        if any(not s for s in self.special_tokens):
            raise TokenizerError("a special token's text must not be empty")
        self._special_bytes = {i: s.encode("utf-8") for s, i in self.special_tokens.items()}
        self._n_bpe = n
        ranks = {data: i for i, data in enumerate(self._vocab)}
        self._encoding: tiktoken.Encoding | None = None
        self._rank = {pair: k for k, pair in enumerate(self.merges)}
        self._token_of_byte = {b: i for i, b in enumerate(base)}
        # GPT-2's pattern is run as its lookahead-free form on pieces cut by
        # cut_whitespace_runs (same chunks, and about twice as fast in tiktoken)
        self._cut_runs = self.pattern == GPT2_PATTERN
        # tiktoken only where it gives the spec's tokens (see merges_follow_byte_ranks);
        # otherwise (two merges spell the same bytes, or a merge that byte-ranked BPE
        # would not make) the spec's algorithm, in O(n log n) per chunk
        if len(ranks) == n and merges_follow_byte_ranks(self._vocab, self.merges):
            self._encoding = tiktoken.Encoding(
                name, pat_str=GPT2_NO_LOOKAHEAD if self._cut_runs else self.pattern,
                mergeable_ranks=ranks, special_tokens={})
        self._compiled = regex.compile(self.pattern)
        self._chunk_cache = lru_cache(maxsize=1 << 16)(self._bpe_chunk)

    # --- construction ------------------------------------------------------------------

    @classmethod
    def byte_level(cls, special_tokens: Collection[str] = ()) -> Tokenizer:
        """256 byte tokens and no merges (the character-level recipe); special tokens,
        if any, follow at 256, 257, …."""
        return cls([], special_tokens={s: 256 + i for i, s in enumerate(special_tokens)})

    @classmethod
    def train(cls, text: str, vocab_size: int, pattern: str = "gpt2",
              special_tokens: Collection[str] = (ENDOFTEXT,),
              progress: Callable[[int], None] | None = None) -> Tokenizer:
        """Learn merges so that the vocabulary, special tokens included, has vocab_size
        tokens (fewer if the text runs out of pairs); special tokens come last."""
        special_tokens = list(dict.fromkeys(special_tokens))
        check_vocab_size(vocab_size, len(special_tokens))
        pattern = resolve_pattern(pattern)
        merges = train_merges(text, vocab_size - 256 - len(special_tokens), pattern,
                              special_tokens, progress)
        n = 256 + len(merges)
        return cls(merges, pattern, {s: n + i for i, s in enumerate(special_tokens)})

    # --- properties -------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return max([self._n_bpe - 1, *self.special_tokens.values()]) + 1

    @property
    def eot_token(self) -> int | None:
        return self.special_tokens.get(ENDOFTEXT)

    def token_bytes(self, token: int) -> bytes:
        if 0 <= token < self._n_bpe:
            return self._vocab[token]
        if token in self._special_bytes:
            return self._special_bytes[token]
        raise TokenizerError(f"token id {token} is not in the vocabulary (size {self.vocab_size})")

    def mergeable_ranks(self) -> dict[bytes, int]:
        """tiktoken's view of the BPE tokens: bytes → id."""
        return {data: i for i, data in enumerate(self._vocab)}

    # --- encode / decode ----------------------------------------------------------------

    def encode(self, text: str, allowed_special: Collection[str] | str = (),
               num_threads: int = 1) -> list[int]:
        """Text → tokens. Special tokens in ``allowed_special`` (or "all") become their
        ids; the text of any other special token is an error. With ``num_threads`` > 1 a
        long text is cut into pieces at places where every chunking agrees and the
        pieces are encoded in parallel (tiktoken releases the GIL); same tokens."""
        if not isinstance(text, str):
            raise TokenizerError(f"can only encode str, got {type(text).__name__}")
        if allowed_special == "all":
            allowed = set(self.special_tokens)
        elif isinstance(allowed_special, str):  # one token named on its own
            allowed = {allowed_special}
        else:
            allowed = set(allowed_special)
        unknown = allowed - set(self.special_tokens)
        if unknown:
            raise TokenizerError(f"allowed_special names unknown special tokens: {sorted(unknown)}")
        for special in self.special_tokens:
            if special not in allowed and special in text:
                raise TokenizerError(
                    f"text contains the special token {special!r}, which is not allowed here "
                    f"(allowed_special encodes it as its id)")
        if not allowed:
            return self.encode_ordinary(text, num_threads)
        # longest first, so that where two start at one place the longer one wins
        alternatives = "|".join(regex.escape(s) for s in sorted(allowed, key=len, reverse=True))
        ids: list[int] = []
        start = 0
        for match in regex.finditer(alternatives, text):
            ids += self.encode_ordinary(text[start:match.start()], num_threads)
            ids.append(self.special_tokens[match.group()])
            start = match.end()
        ids += self.encode_ordinary(text[start:], num_threads)
        return ids

    def encode_ordinary(self, text: str, num_threads: int = 1,
                        min_piece: int = PARALLEL_MIN_PIECE) -> list[int]:
        """Text → tokens, reading special tokens' text as ordinary text."""
        if not text.isascii():
            _check_unicode(text)
        if not self.merges and self.base == IDENTITY_BASE:
            return list(text.encode("utf-8"))
        if self._encoding is not None:
            if num_threads > 1 and self.pattern in SPLITTABLE and len(text) >= 2 * min_piece:
                pieces = split_for_threads(text, min(num_threads, len(text) // min_piece))
                with ThreadPoolExecutor(num_threads) as pool:
                    parts = list(pool.map(self._encode_tiktoken, pieces))
                return [t for part in parts for t in part]
            return self._encode_tiktoken(text)
        ids: list[int] = []
        for chunk in findall_within_budget(self._compiled, text):
            ids += self._chunk_cache(chunk)
        return ids

    def _encode_tiktoken(self, text: str) -> list[int]:
        assert self._encoding is not None
        encode = self._encoding.encode_ordinary
        try:
            if not self._cut_runs:
                return encode(text)
            ids: list[int] = []
            for piece in cut_whitespace_runs(text):
                ids += encode(piece)
            return ids
        except BaseException as err:  # noqa: BLE001
            # tiktoken's regex engine past its backtracking limit panics (a BaseException
            # from Rust); resolve_pattern keeps such patterns out, this is the backstop
            if type(err).__name__ != "PanicException":
                raise
            raise TokenizerError(f"tiktoken gave up encoding this text: "
                                 f"{str(err).splitlines()[0] if str(err) else 'panic'}") from None

    def _bpe_chunk(self, chunk: str) -> tuple[int, ...]:
        ids = [self._token_of_byte[b] for b in chunk.encode("utf-8")]
        return tuple(bpe_lowest_rank_first(ids, self._rank))

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        ids = list(ids)
        vocab, n = self._vocab, self._n_bpe
        try:
            if ids and min(ids) >= 0 and max(ids) < n:
                return b"".join([vocab[i] for i in ids])
        except TypeError:
            raise TokenizerError("token ids must be integers") from None
        return b"".join([self.token_bytes(i) for i in ids])

    def decode(self, ids: Iterable[int]) -> str:
        """Tokens → text; byte sequences that are not UTF-8 become U+FFFD."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    # --- files -------------------------------------------------------------------------

    def save(self, path: str | Path, format: str = "gptspec") -> None:
        """Write the tokenizer: 'gptspec' (this project's JSON), 'tiktoken' (ranks only)
        or 'hf' (HF tokenizers' tokenizer.json). Written atomically."""
        from gptspec.fast import tokenizer_files

        tokenizer_files.save(self, path, format)

    @classmethod
    def load(cls, path: str | Path, format: str | None = None, **options) -> Tokenizer:
        """Read a tokenizer file of any of the three formats (detected when not given)."""
        from gptspec.fast import tokenizer_files

        return tokenizer_files.load(path, format, **options)

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
                f"special_tokens={self.special_tokens})")


def _check_unicode(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise TokenizerError(
            f"text is not valid Unicode: lone surrogate {text[err.start]!r} at position "
            f"{err.start}") from None


class FastTokenizerBackend:
    """The fast tokenizer as a conformance tokenizer backend (see
    gptspec.conformance.checks_tokenizer). It is also a suite backend with only the
    tokenizer area: ``gptspec conformance --backend
    gptspec.fast.tokenizer:FastTokenizerBackend --area tokenizer``."""

    protocol_version = 2  # gptspec.conformance.protocol
    capabilities = ("tokenizer",)  # a tokenizer alone: no model, no forward
    name = "fast-tokenizer"
    version = f"gptspec {__import__('gptspec').__version__}, tiktoken {tiktoken.__version__}"
    device = "cpu"
    dtype = "float64"  # token ids are exact; the suite asks every backend for a dtype

    def tokenizer(self) -> FastTokenizerBackend:
        return self

    def train(self, text: str, vocab_size: int, pattern: str) -> list[Pair]:
        check_vocab_size(vocab_size)
        return train_merges(text, vocab_size - 256, resolve_pattern(pattern))

    def build(self, merges: Sequence[Pair], pattern: str,
              special_tokens: Mapping[str, int]) -> Tokenizer:
        return Tokenizer(merges, pattern, special_tokens)

    @staticmethod
    def bytes_to_unicode() -> dict[int, str]:
        """The byte alphabet this tokenizer's HF tokenizer.json files are written in."""
        from gptspec.fast.tokenizer_files import bytes_to_unicode

        return bytes_to_unicode()
