"""Tokenizer files: this project's JSON, tiktoken's ranks, HF tokenizers' tokenizer.json.

- ``gptspec`` (JSON, ``"format": "gptspec-tokenizer"``, version 1): exactly the spec's
  data (pattern, 256 byte values, merges, special tokens), nothing derived.
- ``tiktoken``: ``base64(bytes) rank`` lines, no pattern or special tokens (given when
  loading, GPT-2's by default); merges are recovered from the ranks.
- ``hf``: tokenizer.json with a BPE model over GPT-2's byte alphabet, a Split
  pre-tokenizer and the special tokens as added tokens; GPT-2's vocab.json + merges.txt
  is read too (:func:`load_vocab_merges`).
Every file is written under a temporary name, synced, then renamed, so an interrupted
save leaves the old file whole; a corrupt file raises :class:`TokenizerFileError` naming it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gptspec.atomic_files import write_bytes
from gptspec.fast.tokenizer import (
    ENDOFTEXT,
    GPT2_PATTERN,
    MAX_VOCAB_BYTES,
    MAX_VOCAB_SIZE,
    Tokenizer,
    TokenizerError,
)
from gptspec.reference.tokenizer import bytes_to_unicode
from gptspec.spec.config import parse_json

__all__ = ["TokenizerFileError", "save", "load", "detect_format", "merges_from_ranks", "fingerprint",
           "tokenizer_from_hf_doc", "load_vocab_merges", "FORMATS", "GPTSPEC_FORMAT"]

FORMATS = ("gptspec", "tiktoken", "hf")
GPTSPEC_FORMAT = "gptspec-tokenizer"
GPTSPEC_VERSION = 1
# The largest tokenizer file read (an untrusted input): GPT-2's tokenizer.json is 1.4 MB,
# cl100k's ranks 1.7 MB, o200k's 3.6 MB.
MAX_FILE_BYTES = 64 << 20
# Recovering a tiktoken token's merge replays BPE over its bytes: time ∝ its length².
# The sum of squared token lengths is capped (GPT-2's ranks: a few million).
MAX_RANKS_WORK = 1 << 25


class TokenizerFileError(TokenizerError):
    """A tokenizer file that is missing, unreadable, corrupt, truncated or inconsistent."""


def _read(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise TokenizerFileError(f"tokenizer file {path} is larger than "
                                     f"{MAX_FILE_BYTES >> 20} MiB, the limit")
        return data
    except FileNotFoundError:
        raise TokenizerFileError(f"tokenizer file {path} does not exist") from None
    except IsADirectoryError:
        raise TokenizerFileError(f"tokenizer file {path} is a directory") from None
    except OSError as err:
        raise TokenizerFileError(f"cannot read tokenizer file {path}: {err.strerror}") from None


def _json(path: Path, data: bytes) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise TokenizerFileError(f"{path}: not UTF-8 text (byte {err.start}); corrupt?") from None
    try:
        return parse_json(text)  # a key given twice is refused, not the last one taken
    except ValueError as err:
        raise TokenizerFileError(f"{path}: {err}; truncated or corrupt?") from None


def detect_format(data: bytes) -> str:
    head = data.lstrip()[:1]
    if head == b"{":
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return "gptspec" if b'"format"' in data[:200] else "hf"  # reported as corrupt JSON
        if isinstance(doc, dict) and doc.get("format") == GPTSPEC_FORMAT:
            return "gptspec"
        return "hf"
    return "tiktoken"


def save(tokenizer: Tokenizer, path: str | Path, format: str = "gptspec") -> None:
    writers = {"gptspec": _gptspec_bytes, "tiktoken": _tiktoken_bytes, "hf": _hf_bytes}
    if format not in writers:
        raise TokenizerError(f"unknown tokenizer format {format!r}; choose one of {FORMATS}")
    if format != "gptspec" and len(tokenizer.mergeable_ranks()) != tokenizer._n_bpe:
        raise TokenizerError(f"two merges of this tokenizer spell the same bytes; the "
                             f"{format} format keys tokens by their bytes and cannot hold it")
    if format == "tiktoken" and merges_from_ranks(tokenizer.mergeable_ranks())[0] != tokenizer.merges:
        # ranks hold no merges: a reader recovers the ones byte-ranked BPE makes, which
        # here are others, and would encode differently
        raise TokenizerError("this tokenizer's merges are not the ones byte-ranked BPE "
                             "makes from its tokens (e.g. (a, bc) where BPE joins ab, c); "
                             "the tiktoken format holds only ranks and would change them")
    write_bytes(path, writers[format](tokenizer))


def load(path: str | Path, format: str | None = None, **options: Any) -> Tokenizer:
    """Read a tokenizer. ``options`` for the tiktoken format: ``pattern`` (GPT-2's by
    default) and ``special_tokens`` (default: <|endoftext|> right after the ranks)."""
    path = Path(path)
    data = _read(path)
    if data.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark (Windows editors write
        data = data[3:]                    # one): not part of the JSON or the ranks
    if not data.strip():
        raise TokenizerFileError(f"{path}: the file is empty")
    format = format or detect_format(data)
    readers = {"gptspec": _load_gptspec, "tiktoken": _load_tiktoken, "hf": _load_hf}
    if format not in readers:
        raise TokenizerError(f"unknown tokenizer format {format!r}; choose one of {FORMATS}")
    try:
        return readers[format](path, data, **options)
    except TokenizerFileError:
        raise
    except TokenizerError as err:  # consistent syntax, inconsistent content
        raise TokenizerFileError(f"{path}: {err}") from None


# --- this project's format ------------------------------------------------------------


def fingerprint(tok: Tokenizer) -> str:
    """SHA-256 of what a tokenizer is (merges, pattern, special tokens, byte order), the same
    for every file format and layout that holds it."""
    return hashlib.sha256(_gptspec_bytes(tok)).hexdigest()


def _gptspec_bytes(tok: Tokenizer) -> bytes:
    merges = [list(m) for m in tok.merges]
    doc = {
        "format": GPTSPEC_FORMAT,
        "version": GPTSPEC_VERSION,
        "pattern": tok.pattern,
        "base": list(tok.base),
        "special_tokens": tok.special_tokens,
        "merges": merges,
    }
    # one merge per line keeps the file diffable and readable
    head = json.dumps({k: v for k, v in doc.items() if k != "merges"}, ensure_ascii=False,
                      indent=1)[:-2]
    lines = ",\n  ".join(json.dumps(m) for m in merges)
    return (head + ',\n "merges": [\n  ' + lines + "\n ]\n}\n").encode("utf-8")


def _field(path: Path, doc: dict, name: str, kind: type | tuple[type, ...]) -> Any:
    if name not in doc:
        raise TokenizerFileError(f"{path}: missing field {name!r}")
    value = doc[name]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TokenizerFileError(f"{path}: field {name!r} has the wrong type "
                                 f"({type(value).__name__})")
    return value


def _load_gptspec(path: Path, data: bytes) -> Tokenizer:
    doc = _json(path, data)
    if not isinstance(doc, dict) or doc.get("format") != GPTSPEC_FORMAT:
        raise TokenizerFileError(f"{path}: not a gptspec tokenizer file (no \"format\": "
                                 f"\"{GPTSPEC_FORMAT}\")")
    unknown = sorted(set(doc) - {"format", "version", "pattern", "base", "special_tokens",
                                 "merges"})
    if unknown:  # a field this reader would skip may change what the writer meant
        raise TokenizerFileError(f"{path}: unknown field {str(unknown[0])[:40]!r} (a gptspec "
                                 "tokenizer holds format, version, pattern, base, "
                                 "special_tokens and merges)")
    version = _field(path, doc, "version", int)
    if version != GPTSPEC_VERSION:
        raise TokenizerFileError(f"{path}: unsupported version {version} (this reads "
                                 f"{GPTSPEC_VERSION})")
    pattern = _field(path, doc, "pattern", str)
    base = _field(path, doc, "base", list)
    merges = _field(path, doc, "merges", list)
    special = _field(path, doc, "special_tokens", dict)
    if len(base) != 256 or not all(isinstance(b, int) and not isinstance(b, bool)
                                   for b in base):
        raise TokenizerFileError(f"{path}: 'base' must list 256 byte values")
    for text, token in special.items():
        if not isinstance(token, int) or isinstance(token, bool):
            raise TokenizerFileError(f"{path}: special token {text[:40]!r} has id {token!r}, "
                                     "not an integer")
    named: dict[int, str] = {}
    for text, token in special.items():
        if token in named:
            raise TokenizerFileError(f"{path}: special tokens {named[token][:40]!r} and "
                                     f"{text[:40]!r} both have id {token}")
        named[token] = text
    if len(merges) > MAX_VOCAB_SIZE:
        raise TokenizerFileError(f"{path}: {len(merges)} merges, more than the limit of "
                                 f"{MAX_VOCAB_SIZE}")
    for k, m in enumerate(merges):
        if (not isinstance(m, list) or len(m) != 2
                or not all(isinstance(t, int) and not isinstance(t, bool) for t in m)):
            raise TokenizerFileError(f"{path}: merge {k} is not a pair of token ids: {m!r}")
    return Tokenizer([tuple(m) for m in merges], pattern, special, base)


# --- tiktoken's ranks -------------------------------------------------------------------


def _tiktoken_bytes(tok: Tokenizer) -> bytes:
    lines = (f"{base64.b64encode(data).decode('ascii')} {rank}\n"
             for data, rank in tok.mergeable_ranks().items())
    return "".join(lines).encode("ascii")


def merges_from_ranks(ranks: Mapping[bytes, int]) -> tuple[list[tuple[int, int]], list[int]]:
    """(merges, base) from tiktoken ranks 0 … n−1 whose first 256 are the single bytes.

    Token r's merge is the pair that BPE over its bytes, allowed only ranks below r,
    ends with: the two tokens that were joined last when r was learned."""
    n = len(ranks)
    by_rank = sorted(ranks.items(), key=lambda item: item[1])
    if [r for _, r in by_rank] != list(range(n)):
        raise TokenizerError("ranks must be 0, 1, …, n−1, each once")
    if n < 256 or any(len(data) != 1 for data, _ in by_rank[:256]):
        raise TokenizerError("the first 256 ranks must be the 256 single bytes")
    base = [data[0] for data, _ in by_rank[:256]]
    merges: list[tuple[int, int]] = []
    for data, r in by_rank[256:]:
        parts = [data[i : i + 1] for i in range(len(data))]
        while len(parts) > 2:
            best = None
            for j in range(len(parts) - 1):
                q = ranks.get(parts[j] + parts[j + 1])
                if q is not None and q < r and (best is None or q < best[0]):
                    best = (q, j)
            if best is None:
                break
            j = best[1]
            parts[j : j + 2] = [parts[j] + parts[j + 1]]
        if len(parts) != 2:
            raise TokenizerError(f"token of rank {r} ({data!r}) is not a merge of two "
                                 f"tokens of lower rank")
        merges.append((ranks[parts[0]], ranks[parts[1]]))
    return merges, base


def _load_tiktoken(path: Path, data: bytes, pattern: str = GPT2_PATTERN,
                   special_tokens: Mapping[str, int] | None = None) -> Tokenizer:
    ranks: dict[bytes, int] = {}
    total = work = 0
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split()
        try:
            if len(fields) != 2:
                raise ValueError
            token = base64.b64decode(fields[0], validate=True)
            rank = int(fields[1])
        except (ValueError, binascii.Error):
            raise TokenizerFileError(f"{path}: line {number} is not 'base64 rank' "
                                     f"(corrupt, or not a tiktoken ranks file)") from None
        if token in ranks:
            raise TokenizerFileError(f"{path}: line {number} repeats a token")
        ranks[token] = rank
        total += len(token)
        work += len(token) ** 2
        if work > MAX_RANKS_WORK:
            raise TokenizerFileError(f"{path}: its tokens are too long to recover the merges "
                                     f"from (the sum of squared lengths passes {MAX_RANKS_WORK})")
        if total > MAX_VOCAB_BYTES or len(ranks) > MAX_VOCAB_SIZE:
            raise TokenizerFileError(f"{path}: the vocabulary exceeds the limit of "
                                     f"{MAX_VOCAB_BYTES >> 20} MiB or {MAX_VOCAB_SIZE} tokens")
    try:
        merges, base = merges_from_ranks(ranks)
    except TokenizerError as err:
        raise TokenizerFileError(f"{path}: {err} (truncated or corrupt?)") from None
    if special_tokens is None:
        special_tokens = {ENDOFTEXT: len(ranks)}
    return Tokenizer(merges, pattern, special_tokens, base)


# --- HF tokenizers' tokenizer.json ---------------------------------------------------------


def _hf_bytes(tok: Tokenizer) -> bytes:
    phi = bytes_to_unicode()

    def text(token: int) -> str:
        return "".join(phi[b] for b in tok.token_bytes(token))

    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for s, i in sorted(tok.special_tokens.items(), key=lambda item: item[1])
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": tok.pattern}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False},
        ]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None,
            "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": {text(i): i for i in range(256 + len(tok.merges))},
            "merges": [[text(a), text(b)] for a, b in tok.merges],
        },
    }
    return json.dumps(doc, ensure_ascii=False, indent=1).encode("utf-8")


def _hf_pattern(path: Path, doc: dict) -> str:
    """The chunking pattern of a byte-level pre-tokenizer: ByteLevel with GPT-2's own
    regex, or an isolating Split by a regex followed by ByteLevel without one. Anything
    else chunks text in a way one pattern cannot say, and is refused."""
    pre = doc.get("pre_tokenizer")
    steps = pre.get("pretokenizers", [pre]) if isinstance(pre, dict) else []
    steps = [s for s in steps if isinstance(s, dict)]
    kinds = [s.get("type") for s in steps]
    if not steps or kinds.count("ByteLevel") != 1:
        raise TokenizerFileError(f"{path}: the pre-tokenizer is not byte-level "
                                 f"(steps {kinds}, expected one ByteLevel)")
    level = steps[kinds.index("ByteLevel")]
    if level.get("add_prefix_space"):
        raise TokenizerFileError(f"{path}: ByteLevel add_prefix_space is not supported")
    splits = [s for s in steps if s.get("type") == "Split"]
    others = sorted({str(k) for k in kinds} - {"Split", "ByteLevel"})
    if others or len(splits) > 1 or (splits and level.get("use_regex", True)):
        raise TokenizerFileError(f"{path}: pre-tokenizer steps {kinds} chunk text in a way "
                                 f"one pattern cannot express")
    if not splits:
        if not level.get("use_regex", True):
            raise TokenizerFileError(f"{path}: no Split or ByteLevel pre-tokenizer with a "
                                     f"pattern")
        return GPT2_PATTERN  # the ByteLevel pre-tokenizer's own regex is GPT-2's
    split = splits[0]
    regex_text = (split.get("pattern") or {}).get("Regex")
    if not isinstance(regex_text, str):
        raise TokenizerFileError(f"{path}: the Split pre-tokenizer has no Regex pattern")
    if split.get("behavior") != "Isolated" or split.get("invert"):
        raise TokenizerFileError(f"{path}: Split behavior {split.get('behavior')!r} "
                                 f"(invert {split.get('invert')}) is not 'Isolated' matches")
    return regex_text


def _check_hf_post_processor(path: Path, processor: Any) -> None:
    """Refuse a post-processor that adds ids. ByteLevel (GPT-2's own file has one, with
    add_prefix_space true and trim_offsets false) only adjusts offsets, whatever its
    settings; TemplateProcessing, RobertaProcessing, BertProcessing put tokens around
    every encoding, which this tokenizer would not."""
    if processor is None:
        return
    steps = processor.get("processors") if isinstance(processor, dict) and \
        processor.get("type") == "Sequence" else [processor]
    for step in steps if isinstance(steps, list) else [steps]:
        kind = step.get("type") if isinstance(step, dict) else None
        if kind != "ByteLevel":
            raise TokenizerFileError(f"{path}: post_processor {kind or str(step)[:40]!r} "
                                     f"adds tokens to every encoding, which this tokenizer "
                                     f"does not; only none or ByteLevel is supported")


def _load_hf(path: Path, data: bytes) -> Tokenizer:
    return tokenizer_from_hf_doc(path, _json(path, data))


def tokenizer_from_hf_doc(path: Path, doc: Any) -> Tokenizer:
    """The tokenizer of a parsed HF tokenizer.json (``path`` names it in errors). Only a
    byte-level BPE whose encoding this tokenizer reproduces id for id is accepted."""
    model = doc.get("model") if isinstance(doc, dict) else None
    if not isinstance(model, dict) or model.get("type") != "BPE":
        kind = model.get("type") if isinstance(model, dict) else None
        what = f" (its model is {kind})" if isinstance(kind, str) else ""
        raise TokenizerFileError(f"{path}: not an HF tokenizer.json with a BPE model{what}")
    if doc.get("normalizer"):
        raise TokenizerFileError(f"{path}: has a normalizer, which this tokenizer does not apply")
    pattern = _hf_pattern(path, doc)
    _check_hf_post_processor(path, doc.get("post_processor"))
    # options that change which ids BPE gives ("" is how GPT-2's own file says "none")
    for option in ("dropout", "continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(option):
            raise TokenizerFileError(f"{path}: BPE option {option}={model[option]!r} is not "
                                     f"supported")
    vocab, merges_text = model.get("vocab"), model.get("merges")
    if not isinstance(vocab, dict) or not isinstance(merges_text, list):
        raise TokenizerFileError(f"{path}: the BPE model lacks 'vocab' or 'merges'")
    special: dict[str, int] = {}
    special_ids: dict[int, str] = {}
    added_tokens = doc.get("added_tokens") or []
    if not isinstance(added_tokens, list):  # a dict would be read as its keys, dropping ids
        raise TokenizerFileError(f"{path}: 'added_tokens' must be a list, got "
                                 f"{type(added_tokens).__name__}")
    for added in added_tokens:
        if not isinstance(added, dict):  # skipping it would drop a special token unnoticed
            raise TokenizerFileError(f"{path}: an added token is not an object: "
                                     f"{str(added)[:40]!r}")
        if not added.get("special"):  # HF matches these in raw text; BPE here would not
            raise TokenizerFileError(f"{path}: added token {added.get('content')!r} is not "
                                     f"special; only special added tokens are supported")
        content, token = added.get("content"), added.get("id")
        # HF strips the white space beside a token matched with lstrip/rstrip, and matches
        # a single_word one only between word boundaries; here a special token's text is
        # matched wherever it stands and the text around it kept. (normalized says whether
        # to match in the normalized text: with no normalizer, the text itself.)
        changing = [option for option in ("lstrip", "rstrip", "single_word") if added.get(option)]
        if changing:
            raise TokenizerFileError(f"{path}: added token {str(content)[:40]!r} sets "
                                     f"{', '.join(o + '=true' for o in changing)}, which "
                                     f"changes where HF matches it and the ids around it")
        if not isinstance(content, str) or not isinstance(token, int) or isinstance(token, bool):
            raise TokenizerFileError(f"{path}: added token {str(content)[:40]!r} needs text "
                                     f"and an integer id, got id {token!r}")
        # a repeat would be dropped (same text) or leave two texts one id; HF's own reader
        # keeps one copy silently, so a file meant otherwise would load as something else
        if content in special:
            raise TokenizerFileError(f"{path}: added token {content[:40]!r} is listed twice "
                                     f"(ids {special[content]} and {token})")
        if token in special_ids:
            raise TokenizerFileError(f"{path}: added tokens {special_ids[token][:40]!r} and "
                                     f"{content[:40]!r} both have id {token}")
        special[content] = token
        special_ids[token] = content
    holder: dict[int, str] = {}
    for text, token in vocab.items():  # two texts, one id: HF decodes it as one of them
        if not isinstance(token, int):
            continue  # (reported below as ids that are not 0 … n−1)
        if token in holder:
            raise TokenizerFileError(f"{path}: the vocabulary gives {holder[token][:40]!r} and "
                                     f"{text[:40]!r} the same id {token}")
        holder[token] = text
    inverse = {c: b for b, c in bytes_to_unicode().items()}
    try:  # a special token may also be listed in the model's vocab; it is not BPE's
        id_bytes = {i: bytes(inverse[c] for c in s) for s, i in vocab.items()
                    if s not in special}
    except (KeyError, TypeError):
        raise TokenizerFileError(f"{path}: the vocabulary is not over GPT-2's byte "
                                 f"alphabet (not a byte-level BPE)") from None
    if sorted(id_bytes) != list(range(len(id_bytes))) or len(id_bytes) < 256:
        low = sorted(i for i in special.values() if isinstance(i, int) and i < len(id_bytes))
        where = f" (special tokens at ids {low[:3]})" if low else ""
        raise TokenizerFileError(f"{path}: BPE token ids must be 0 … n−1, the 256 bytes first, "
                                 f"special tokens after them{where}")
    if any(len(id_bytes[i]) != 1 for i in range(256)):
        raise TokenizerFileError(f"{path}: ids 0 … 255 must be the 256 single bytes")
    if len(merges_text) != len(id_bytes) - 256:
        raise TokenizerFileError(f"{path}: {len(merges_text)} merges for "
                                 f"{len(id_bytes) - 256} tokens beyond the bytes")
    merges = []
    for k, m in enumerate(merges_text):
        pair = m.split(" ") if isinstance(m, str) else m
        if not isinstance(pair, list) or len(pair) != 2 or any(p not in vocab for p in pair):
            raise TokenizerFileError(f"{path}: merge {k} is not a pair of known tokens: {m!r}")
        a, b = vocab[pair[0]], vocab[pair[1]]
        if id_bytes[a] + id_bytes[b] != id_bytes[256 + k]:
            raise TokenizerFileError(f"{path}: merge {k} does not make token {256 + k} "
                                     f"(merges out of vocabulary order)")
        merges.append((a, b))
    base = [id_bytes[i][0] for i in range(256)]
    return Tokenizer(merges, pattern, special, base)


# --- GPT-2's classic vocab.json + merges.txt ------------------------------------------------


def load_vocab_merges(vocab_path: str | Path, merges_path: str | Path,
                      special_tokens: Mapping[str, int] | None = None) -> Tokenizer:
    """The tokenizer of GPT-2's original pair of files: vocab.json (token text in GPT-2's
    byte alphabet → id) and merges.txt (a ``#version`` line, then one ``a b`` merge a
    line), pre-tokenized by GPT-2's pattern. Vocabulary entries no merge makes (GPT-2's
    ``<|endoftext|>`` at 50256) are special tokens, as are ``special_tokens``."""
    vocab_path, merges_path = Path(vocab_path), Path(merges_path)
    vocab = _json(vocab_path, _read(vocab_path))
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise TokenizerFileError(f"{vocab_path}: not a JSON object of token text → id")
    try:
        text = _read(merges_path).decode("utf-8")
    except UnicodeDecodeError as err:
        raise TokenizerFileError(f"{merges_path}: not UTF-8 text (byte {err.start}); "
                                 f"corrupt?") from None
    merges = [line for line in text.splitlines()
              if line.strip() and not line.startswith("#version")]
    n_bpe = 256 + len(merges)
    special = {s: i for s, i in vocab.items() if i >= n_bpe}
    special.update(special_tokens or {})
    doc = {  # the same tokenizer as HF's tokenizer.json would state it
        "added_tokens": [{"id": i, "content": s, "special": True} for s, i in special.items()],
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
        "model": {"type": "BPE", "vocab": vocab, "merges": merges},
    }
    label = Path(f"{vocab_path} + {merges_path.name}")  # errors name both files
    try:
        return tokenizer_from_hf_doc(label, doc)
    except TokenizerFileError:
        raise
    except TokenizerError as err:
        raise TokenizerFileError(f"{label}: {err}") from None
