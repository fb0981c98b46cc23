"""The text every study trains and validates on, and its tokenizations.

The split is made on the *text*, so every tokenizer sees the same training text and is
judged on the same validation text: the last ``val_fraction`` of the characters, cut at
the start of a line. Each BPE tokenizer is trained on the training split alone (no
special tokens); both splits are encoded with it and cached as ``.npy`` files named by
the text's SHA-256, with a record of each file's SHA-256: a file changed since it was
written is made again, not trained on.
"""

from __future__ import annotations

import errno
import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gptspec.atomic_files import replacing, write_text
from gptspec.experiments.studies import BYTE_LEVEL, Study
from gptspec.spec.config import parse_json

PREPARATION_VERSION = 1  # bump when the files below would be made differently


@dataclass(frozen=True)
class Corpus:
    source: str  # what the text is, for the results' provenance
    train_text: str
    val_text: str
    sha256: str  # of the whole text used (both splits)

    @property
    def train_bytes(self) -> int:
        return len(self.train_text.encode("utf-8"))

    @property
    def val_bytes(self) -> int:
        return len(self.val_text.encode("utf-8"))


def split_text(text: str, source: str, val_fraction: float) -> Corpus:
    """The text's first (1 − val_fraction) of characters for training, the rest for
    validation, cut after the last newline before that point (if there is one)."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must lie in (0, 1), got {val_fraction}")
    point = int(len(text) * (1 - val_fraction))
    newline = text.rfind("\n", 0, point)
    cut = newline + 1 if newline > 0 else point
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return Corpus(source, text[:cut], text[cut:], digest)


def corpus_problem(studies: Sequence[Study], corpus: Corpus) -> str | None:
    """Why the studies cannot run on ``corpus``, as far as its bytes alone tell (no
    tokenizer trained): a token spells at least one byte, so a split of fewer bytes than a
    study's windows need holds too few tokens whatever the vocabulary; and each BPE merge
    takes at least one pair of the training split's bytes away. ``--plan`` refuses what
    this refuses, with the same line; a tokenizer that stops early is found by training."""
    for s in studies:
        need = max(s.scale.n_ctx + 1, s.scale.curve_windows)
        if min(corpus.train_bytes, corpus.val_bytes) < need:
            return (f"the corpus is too short: its splits hold {corpus.train_bytes:,} and "
                    f"{corpus.val_bytes:,} bytes, and the {s.name} study needs at least "
                    f"{need:,} tokens in each (a token is at least one byte)")
    merges = max(corpus.train_bytes - 1, 0)
    for v in sorted({arm.vocab for s in studies for arm in s.arms} - {BYTE_LEVEL}):
        if v - BYTE_LEVEL > merges:
            return (f"the corpus is too short: its training split's {corpus.train_bytes:,} "
                    f"bytes allow at most {merges:,} merges, and a BPE vocabulary of {v:,} "
                    f"needs {v - BYTE_LEVEL:,}")
    return None


@dataclass(frozen=True)
class Tokenized:
    """A tokenizer's files for one corpus, and what the runs' settings record of them."""

    vocab: int
    tokenizer: Path
    train: Path
    val: Path
    tokenizer_sha256: str
    train_tokens: int
    val_tokens: int
    # each file's SHA-256 ("tokenizer", "train", "val"), as the cache's record has it: the
    # run's process checks them again before it trains (the files may change meanwhile)
    sha256: dict[str, str] = field(default_factory=dict, compare=False)

    def describe(self) -> dict:
        """What decides a run's result: the tokenizer's exact content and the split sizes."""
        return {"vocab": self.vocab, "sha256": self.tokenizer_sha256,
                "train_tokens": self.train_tokens, "val_tokens": self.val_tokens}


def _name(vocab: int) -> str:
    return "bytes" if vocab == BYTE_LEVEL else f"bpe-{vocab}"


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read in blocks (a full study's token files are tens
    of megabytes)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def cache_problem(meta: dict | None, files: dict[str, Path], corpus: Corpus,
                  vocab: int) -> str | None:
    """Why the cached files cannot be reused (naming the file at fault), or None when the
    record is of this corpus and vocabulary and every file has the SHA-256 it records."""
    if meta is None:
        return "its record is missing or unreadable"
    if meta.get("version") != PREPARATION_VERSION or meta.get("corpus") != corpus.sha256 \
            or meta.get("vocab") != vocab:
        return "its record is of another corpus, vocabulary or preparation"
    digests = meta.get("sha256")
    if not (isinstance(digests, dict) and _count(meta.get("train_tokens"))
            and _count(meta.get("val_tokens"))
            and meta.get("tokenizer_sha256") == digests.get("tokenizer")):
        return "its record does not hold each file's SHA-256 and token count"
    for name, path in files.items():
        if not path.is_file():
            return f"{path} is missing"
        try:
            actual = file_sha256(path)
        except OSError as err:
            return f"{path} cannot be read ({err.strerror or err})"
        if actual != digests.get(name):
            return f"{path} is not the file the cache made (its SHA-256 differs)"
    return None


class CacheWriteError(OSError):
    """A cache file that could not be written, named (the CLI says "STRERROR: FILE"), and
    said to be a full disk where it is: NumPy reports a short write as "N requested and
    M written", with no errno, and the user saw that alone."""

    def __init__(self, path: Path, err: OSError) -> None:
        full = "cannot write the token cache, the disk is full"
        if err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            code, why = err.errno, f"{full} ({err.strerror})"
        elif err.errno is None and " requested and " in str(err):
            code, why = errno.ENOSPC, f"{full} (a short write: {err})"
        else:
            code, why = err.errno, f"cannot write the token cache ({err.strerror or err})"
        super().__init__(code, why, str(path))


def tokenize(corpus: Corpus, vocab: int, cache: Path,
             note: Callable[[str], None] | None = None) -> Tokenized:
    """The tokenizer of ``vocab`` tokens for this corpus and both splits' token ids, made
    once and kept under ``cache`` (every file written whole, then renamed). Cached files
    are reused only if each has the SHA-256 their record holds; otherwise they are made
    again, and ``note`` is told why (one line naming the file)."""
    from gptspec.fast.tokenizer import Tokenizer

    folder = cache / f"{corpus.sha256[:16]}-{len(corpus.train_text)}"
    stem = folder / _name(vocab)
    meta_path = stem.with_suffix(".json")
    files = {"tokenizer": stem.with_suffix(".tokenizer.json"),
             "train": stem.with_suffix(".train.npy"), "val": stem.with_suffix(".val.npy")}
    meta = _read_meta(meta_path)
    problem = cache_problem(meta, files, corpus, vocab)
    if problem is not None:
        if note is not None and (meta_path.exists() or any(f.exists() for f in files.values())):
            note(f"  cache of {_name(vocab)}: {problem}; making it again")
        tokenizer = (Tokenizer.byte_level() if vocab == BYTE_LEVEL
                     else Tokenizer.train(corpus.train_text, vocab, special_tokens=()))
        if tokenizer.vocab_size != vocab:
            raise ValueError(f"its training split has too few distinct pairs for a BPE "
                             f"vocabulary of {vocab} (training stopped at "
                             f"{tokenizer.vocab_size})")
        folder.mkdir(parents=True, exist_ok=True)
        target = files["tokenizer"]  # the file being written, named if that fails
        try:
            tokenizer.save(target)  # written whole, then renamed
            counts = {}
            for split, text in (("train", corpus.train_text), ("val", corpus.val_text)):
                ids = np.asarray(tokenizer.encode_ordinary(text), dtype=np.uint16)
                target = files[split]
                with replacing(target) as tmp, open(tmp, "wb") as f:
                    np.save(f, ids, allow_pickle=False)
                counts[split] = int(ids.size)
            digests = {name: file_sha256(path) for name, path in files.items()}
            meta = {"version": PREPARATION_VERSION, "corpus": corpus.sha256, "vocab": vocab,
                    "tokenizer_sha256": digests["tokenizer"], "sha256": digests,
                    "train_tokens": counts["train"], "val_tokens": counts["val"]}
            target = meta_path
            write_text(target, json.dumps(meta, indent=1))
        except OSError as err:
            raise CacheWriteError(target, err) from None
    assert meta is not None
    return Tokenized(vocab, files["tokenizer"], files["train"], files["val"],
                     meta["tokenizer_sha256"], meta["train_tokens"], meta["val_tokens"],
                     dict(meta["sha256"]))


def _read_meta(path: Path) -> dict | None:
    """The cache's record, or None where there is none or it cannot be read (JSON nested
    deeper than the parser follows included): the files are made again."""
    try:
        data = parse_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
