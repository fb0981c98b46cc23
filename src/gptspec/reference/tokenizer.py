"""The byte-level BPE tokenizer, transcribed literally: one function per spec entry.

Read each function beside its entry (``gptspec.spec.REGISTRY[name]``). Correctness and
readability come first: training recounts every pair after every merge, encoding rescans
a chunk after every merge; ``gptspec.fast.tokenizer`` computes the same maps quickly.
A tokenizer is plain data: ``merges`` in learned order (``merges[k] = (a, b)`` makes
token ``256 + k`` from adjacent ``a`` then ``b``; k is its rank); ``base``, the byte of
each of the 256 base tokens (the identity for tokenizers trained here, a permutation for
GPT-2's); ``special_tokens``, text → id for tokens such as ``<|endoftext|>`` that never
come out of BPE and are produced only where the caller allows them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence

import regex

__all__ = [
    "byte_tokens",
    "pretokenize",
    "pair_counts",
    "best_pair",
    "merge_pair",
    "train",
    "token_bytes",
    "bpe_chunk",
    "split_special",
    "encode",
    "decode",
    "bytes_to_unicode",
]

# GPT-2's pre-tokenization pattern, as published with GPT-2's encoder: contractions,
# an optional space then letters, an optional space then digits, an optional space then
# other symbols, whitespace not followed by a non-space, and remaining whitespace.
GPT2_PATTERN = (
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)
# The cl100k-style pattern (GPT-4's tokenizer): case-insensitive contractions, a
# non-letter prefix glued to a word, digits in groups of at most three, newlines kept
# with the symbols or whitespace before them.
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
PATTERNS = {"gpt2": GPT2_PATTERN, "cl100k": CL100K_PATTERN}
ENDOFTEXT = "<|endoftext|>"
IDENTITY_BASE = tuple(range(256))

Pair = tuple[int, int]


def byte_tokens(base: Sequence[int] = IDENTITY_BASE) -> list[bytes]:
    """The base vocabulary: token i (0 ≤ i < 256) is the single byte base[i]."""
    if sorted(base) != list(range(256)):
        raise ValueError("base must list each of the 256 byte values exactly once")
    return [bytes([b]) for b in base]


def pretokenize(text: str, pattern: str = GPT2_PATTERN) -> list[str]:
    """Split text into chunks: the successive leftmost matches of the pattern.

    BPE runs inside each chunk on its own; no token ever spans two chunks. Every
    character of text lies in some match for both patterns here, so the chunks
    concatenate back to text."""
    return regex.findall(pattern, text)


def pair_counts(chunks: Mapping[tuple[int, ...], int]) -> Counter[Pair]:
    """c(a, b) = Σ over chunks w of mult(w) · #{j : (w_j, w_{j+1}) = (a, b)}.

    ``chunks`` maps each distinct chunk (a tuple of token ids) to the number of times it
    occurs in the text. Overlapping occurrences count: (a, a) occurs twice in a a a."""
    counts: Counter[Pair] = Counter()
    for w, mult in chunks.items():
        for j in range(len(w) - 1):
            counts[(w[j], w[j + 1])] += mult
    return counts


def best_pair(counts: Mapping[Pair, int]) -> Pair | None:
    """The pair learned next: the largest count; among equal counts the smallest pair in
    lexicographic order of (a, b). None when no pair occurs."""
    candidates = [(pair, c) for pair, c in counts.items() if c > 0]
    if not candidates:
        return None
    top = max(c for _, c in candidates)
    return min(pair for pair, c in candidates if c == top)


def merge_pair(ids: Sequence[int], pair: Pair, new_id: int) -> list[int]:
    """Replace each occurrence of pair in ids by new_id, scanning left to right; an
    occurrence that overlaps one already replaced is skipped (a a a → (a a) a)."""
    out: list[int] = []
    j = 0
    while j < len(ids):
        if j + 1 < len(ids) and (ids[j], ids[j + 1]) == pair:
            out.append(new_id)
            j += 2
        else:
            out.append(ids[j])
            j += 1
    return out


def train(text: str, vocab_size: int, pattern: str = GPT2_PATTERN,
          special_tokens: Collection[str] = ()) -> list[Pair]:
    """Learn vocab_size − 256 merges from text (fewer when no adjacent pair is left).

    The text is cut at every occurrence of a special token's text (no merge is learned
    across one), pre-tokenized, and each chunk starts as its UTF-8 bytes. Then, for
    k = 0, 1, …: count the pairs, take the best pair, record it as merge k (token
    256 + k) and replace it in every chunk."""
    if vocab_size < 256:
        raise ValueError(f"vocab_size must be at least 256 (the byte tokens), got {vocab_size}")
    pieces = [text]
    for special in special_tokens:
        pieces = [part for piece in pieces for part in piece.split(special)]
    chunks: Counter[tuple[int, ...]] = Counter(
        tuple(chunk.encode("utf-8")) for piece in pieces for chunk in pretokenize(piece, pattern)
    )
    merges: list[Pair] = []
    for k in range(vocab_size - 256):
        pair = best_pair(pair_counts(chunks))
        if pair is None:
            break
        merges.append(pair)
        merged: Counter[tuple[int, ...]] = Counter()
        for w, mult in chunks.items():
            merged[tuple(merge_pair(w, pair, 256 + k))] += mult
        chunks = merged
    return merges


def token_bytes(merges: Sequence[Pair], base: Sequence[int] = IDENTITY_BASE) -> list[bytes]:
    """The bytes of every BPE token: the base bytes, then bytes(a) + bytes(b) per merge."""
    vocab = byte_tokens(base)
    for k, (a, b) in enumerate(merges):
        if not (0 <= a < 256 + k and 0 <= b < 256 + k):
            raise ValueError(f"merge {k} = ({a}, {b}) uses a token not yet defined")
        vocab.append(vocab[a] + vocab[b])
    return vocab


def bpe_chunk(chunk: bytes, merges: Sequence[Pair] | Mapping[Pair, int],
              base: Sequence[int] = IDENTITY_BASE) -> list[int]:
    """Encode one chunk: start from its byte tokens; while some adjacent pair is a merge,
    replace the leftmost occurrence of the lowest-ranked such pair by its token.

    ``merges`` may also be given as its rank table {pair: k}, built once per text."""
    rank = merges if isinstance(merges, Mapping) else {p: k for k, p in enumerate(merges)}
    token_of_byte = {b: i for i, b in enumerate(base)}
    ids = [token_of_byte[b] for b in chunk]
    while True:
        ranked = [(rank[p], j) for j, p in enumerate(zip(ids, ids[1:], strict=False)) if p in rank]
        if not ranked:
            return ids
        k, j = min(ranked)  # lowest rank, then leftmost position
        ids[j : j + 2] = [256 + k]


def split_special(text: str, special_tokens: Mapping[str, int],
                  allowed_special: Collection[str] | str = ()) -> list[str | int]:
    """Cut text at the allowed special tokens: ordinary text segments and special ids.

    Scanning left to right, an allowed special token's text becomes its id (the longest
    if several start at the same place). If the text contains the text of a special
    token that is not allowed, that is an error: it would otherwise silently become
    ordinary tokens."""
    allowed = set(special_tokens) if allowed_special == "all" else set(allowed_special)
    unknown = allowed - set(special_tokens)
    if unknown:
        raise ValueError(f"allowed_special names unknown special tokens: {sorted(unknown)}")
    for special in special_tokens:
        if special not in allowed and special in text:
            raise ValueError(
                f"text contains the special token {special!r}, which is not allowed here; "
                f"allow it to encode it as its id"
            )
    parts: list[str | int] = []
    start = j = 0
    while j < len(text):
        found = [s for s in allowed if text.startswith(s, j)]
        if found:
            special = max(found, key=len)
            if start < j:
                parts.append(text[start:j])
            parts.append(special_tokens[special])
            j = start = j + len(special)
        else:
            j += 1
    if start < len(text):
        parts.append(text[start:])
    return parts


def encode(text: str, merges: Sequence[Pair], pattern: str = GPT2_PATTERN,
           special_tokens: Mapping[str, int] | None = None,
           allowed_special: Collection[str] | str = (),
           base: Sequence[int] = IDENTITY_BASE) -> list[int]:
    """Text → tokens: cut at allowed special tokens, pre-tokenize each ordinary segment,
    encode each chunk's UTF-8 bytes with bpe_chunk, and concatenate."""
    rank = {pair: k for k, pair in enumerate(merges)}
    ids: list[int] = []
    for part in split_special(text, special_tokens or {}, allowed_special):
        if isinstance(part, int):
            ids.append(part)
            continue
        for chunk in pretokenize(part, pattern):
            ids.extend(bpe_chunk(chunk.encode("utf-8"), rank, base))
    return ids


def decode(ids: Iterable[int], merges: Sequence[Pair],
           special_tokens: Mapping[str, int] | None = None,
           base: Sequence[int] = IDENTITY_BASE) -> str:
    """Tokens → text: concatenate the tokens' bytes (a special token's bytes are its text
    in UTF-8) and decode as UTF-8, each maximal subpart of an ill-formed sequence becoming
    one U+FFFD (the spec's decision; Python's errors="replace" implements exactly that
    practice). A token sequence cut in the middle of a character is not an error."""
    vocab = token_bytes(merges, base)
    special_bytes = {i: s.encode("utf-8") for s, i in (special_tokens or {}).items()}
    out = bytearray()
    for i in ids:
        if 0 <= i < len(vocab):
            out += vocab[i]
        elif i in special_bytes:
            out += special_bytes[i]
        else:
            raise ValueError(f"token id {i} is not in the vocabulary")
    return out.decode("utf-8", errors="replace")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, used only to store tokens as text
    (vocab.json, merges.txt, HF tokenizer.json): bytes that are printable Latin-1
    characters stand for themselves; the other 68, in increasing order, become
    chr(256), chr(257), …. It is a bijection, so it changes nothing about the tokens."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in mapping]
    for n, b in enumerate(others):
        mapping[b] = chr(256 + n)
    return dict(sorted(mapping.items()))
