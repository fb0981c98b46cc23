"""Tokenizer backends of engines nobody here wrote: tiktoken and Hugging Face ``tokenizers``,
judged on the tokenizer area alone (``capabilities = ("tokenizer",)``: no model, no
forward). Each builds the engine's own tokenizer from the spec's merges (tiktoken's byte
ranks; HF's byte-level BPE model, vocabulary and merges written in GPT-2's byte alphabet)
and lets it encode and decode; HF's also trains with its own BPE trainer. tiktoken cannot
train (not applicable), and ranks a pair by the bytes it spells: it holds only merges that
byte-ranked BPE makes (``merges_follow_byte_ranks``), others are not applicable.

What the adapters add to the engines is protocol only: the merges' byte strings, an
exception type where the engine raises another, and for HF (which always splits added
tokens) the refusal of a special token's text that the caller did not allow.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from gptspec.conformance.protocol import PROTOCOL_VERSION, NotApplicable
from gptspec.fast.tokenizer import merges_follow_byte_ranks

Pair = tuple[int, int]


def _merged_bytes(merges: Sequence[Pair]) -> list[bytes]:
    """The byte string of each token: 256 bytes, then merge k's two tokens joined. Two
    merges spelling the same bytes cannot be held by an engine that keys tokens by their
    bytes (both do): NotApplicable."""
    table = [bytes([b]) for b in range(256)]
    seen = {t: i for i, t in enumerate(table)}
    for k, (a, b) in enumerate(merges):
        if not (0 <= a < len(table) and 0 <= b < len(table)):
            raise ValueError(f"merge {k} ({a}, {b}) names a token not yet defined")
        spelled = table[a] + table[b]
        if spelled in seen:
            raise NotApplicable(f"merges {seen[spelled]} and {256 + k} spell the same bytes "
                                f"{spelled!r}: the engine keys its tokens by their bytes")
        seen[spelled] = len(table)
        table.append(spelled)
    return table


def _allowed(special: Mapping[str, int], allowed_special: Collection[str] | str) -> set[str]:
    return set(special) if allowed_special == "all" else set(allowed_special)


# --- tiktoken ------------------------------------------------------------------------------


class TiktokenTokenizer:
    def __init__(self, encoding: Any, size: int) -> None:
        self._encoding = encoding
        self._size = size  # ids 0 … size − 1

    def encode(self, text: str, allowed_special: Collection[str] | str = ()) -> list[int]:
        allowed = allowed_special if allowed_special == "all" else set(allowed_special)
        return list(self._encoding.encode(text, allowed_special=allowed,
                                          disallowed_special="all"))

    def decode(self, ids: Sequence[int]) -> str:
        try:
            return str(self._encoding.decode(list(ids)))
        except (KeyError, OverflowError) as err:  # tiktoken's for an unknown id
            raise ValueError(f"id outside the vocabulary of {self._size}: {err}") from None


class TiktokenBackend:
    """tiktoken as a tokenizer backend (``gptspec conformance --backend tiktoken``)."""

    protocol_version = PROTOCOL_VERSION
    capabilities = ("tokenizer",)
    name = "tiktoken"
    device = "cpu"
    dtype = "float64"  # token ids are exact; the suite asks every backend for a dtype

    def __init__(self) -> None:
        import tiktoken

        self.version = f"tiktoken {tiktoken.__version__}"

    def tokenizer(self) -> TiktokenBackend:
        return self

    def train(self, text: str, vocab_size: int, pattern: str) -> list[Pair]:
        raise NotApplicable("tiktoken has no trainer: it encodes with ranks learned elsewhere")

    def build(self, merges: Sequence[Pair], pattern: str,
              special_tokens: Mapping[str, int]) -> TiktokenTokenizer:
        import tiktoken

        vocab = _merged_bytes(merges)
        if not merges_follow_byte_ranks(vocab, merges, max_work=sys.maxsize):
            raise NotApplicable("tiktoken ranks a pair by the bytes it spells, and these merges "
                                "are not the ones byte-ranked BPE makes (such as [(a, b), "
                                "(b, c), (a, bc)]): it cannot hold them")
        ranks = {token: rank for rank, token in enumerate(vocab)}
        encoding = tiktoken.Encoding("gptspec-merges", pat_str=pattern, mergeable_ranks=ranks,
                                     special_tokens=dict(special_tokens))
        return TiktokenTokenizer(encoding, max([len(ranks), *(i + 1 for i in
                                                              special_tokens.values())]))


# --- Hugging Face tokenizers ---------------------------------------------------------------


def byte_alphabet() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, as byte-level BPE files write tokens:
    printable Latin-1 bytes stand for themselves, the other 68 for chr(256 + n) in byte
    order. The adapter needs it to write the vocabulary the engine reads; it is checked
    against the engine's own alphabet on every build."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    shifted = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + n) for n, b in enumerate(shifted)}}


class HFTokenizer:
    def __init__(self, tokenizer: Any, special: Mapping[str, int], size: int) -> None:
        self._tokenizer = tokenizer
        self._special = dict(special)
        self._size = size

    def encode(self, text: str, allowed_special: Collection[str] | str = ()) -> list[int]:
        allowed = _allowed(self._special, allowed_special)
        refused = [s for s in self._special if s not in allowed and s in text]
        if refused:  # HF splits every added token; the protocol refuses one not allowed
            raise ValueError(f"text contains the special token {refused[0]!r}, not allowed")
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        try:
            return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))
        except OverflowError as err:  # a negative id, refused by the binding
            raise ValueError(f"id outside the vocabulary of {self._size}: {err}") from None


class HFTokenizersBackend:
    """Hugging Face ``tokenizers`` as a tokenizer backend (``--backend hf-tokenizers``):
    its byte-level BPE model encodes and decodes, its BpeTrainer trains."""

    protocol_version = PROTOCOL_VERSION
    capabilities = ("tokenizer",)
    name = "hf-tokenizers"
    device = "cpu"
    dtype = "float64"

    def __init__(self) -> None:
        import tokenizers

        self.version = f"tokenizers {tokenizers.__version__}"

    def tokenizer(self) -> HFTokenizersBackend:
        return self

    @staticmethod
    def _pre_tokenizer(pattern: str) -> Any:
        from tokenizers import Regex, pre_tokenizers

        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])

    @staticmethod
    def _alphabet() -> dict[int, str]:
        from tokenizers import pre_tokenizers

        phi = byte_alphabet()
        if set(phi.values()) != set(pre_tokenizers.ByteLevel.alphabet()):
            raise RuntimeError("tokenizers' byte-level alphabet is not GPT-2's")
        return phi

    def train(self, text: str, vocab_size: int, pattern: str) -> list[Pair]:
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = self._pre_tokenizer(pattern)
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=0,
                                      show_progress=False, special_tokens=[],
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator([text], trainer)
        learned = json.loads(tokenizer.to_str())["model"]["merges"]
        to_byte = {c: b for b, c in self._alphabet().items()}
        ids = {bytes([b]): b for b in range(256)}
        merges: list[Pair] = []
        for merge in learned:
            a, b = merge if isinstance(merge, list) else merge.split(" ")
            left, right = (bytes(to_byte[c] for c in s) for s in (a, b))
            merges.append((ids[left], ids[right]))
            ids[left + right] = 255 + len(merges)
        return merges

    def build(self, merges: Sequence[Pair], pattern: str,
              special_tokens: Mapping[str, int]) -> HFTokenizer:
        from tokenizers import AddedToken, Tokenizer, decoders, models

        phi = self._alphabet()
        spelled = _merged_bytes(merges)
        written = ["".join(phi[b] for b in token) for token in spelled]
        vocab = {token: i for i, token in enumerate(written)}
        vocab.update(special_tokens)
        model = models.BPE(vocab=vocab, merges=[(written[a], written[b]) for a, b in merges])
        tokenizer = Tokenizer(model)
        tokenizer.pre_tokenizer = self._pre_tokenizer(pattern)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False)
                                      for s in special_tokens])
        return HFTokenizer(tokenizer, special_tokens, len(vocab))
