"""``gptspec tokenizer train | encode | decode``.

    gptspec tokenizer train --data corpus.txt --vocab-size 4096 --out tokenizer.json
    echo "hello world" | gptspec tokenizer encode --tokenizer tokenizer.json
    gptspec tokenizer decode --tokenizer tokenizer.json --input ids.txt --output text.txt

Token ids are written as whitespace-separated integers (``--json``: a JSON list); decode
reads either. Outputs go to a temporary name first and are renamed when complete.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from gptspec.atomic_files import write_bytes
from gptspec.cli import CLIError, arguments, printable, standard_stream, writing_stdout

FORMATS = ("gptspec", "tiktoken", "hf")
DECIMAL = re.compile(r"-?[0-9]+")  # how a token id is written (a negative one is refused later)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    train = sub.add_parser("train", help="learn BPE merges from a text file")
    train.add_argument("--data", required=True, type=arguments.stream_argument,
                       help="UTF-8 training text: a file or a pipe (-: stdin)")
    train.add_argument("--vocab-size", required=True, type=int,
                       help="tokens in all: 256 bytes + merges + special tokens")
    train.add_argument("--out", required=True, type=arguments.file_argument, help="tokenizer file to write")
    train.add_argument("--pattern", default="gpt2",
                       help="pre-tokenization: 'gpt2' (default), 'cl100k', or a regex")
    train.add_argument("--format", choices=FORMATS, default="gptspec",
                       help="file format (default: gptspec JSON)")
    train.add_argument("--no-endoftext", action="store_true",
                       help="do not add the <|endoftext|> special token")
    train.add_argument("--quiet", action="store_true", help="no progress bar")

    for name, what in (("encode", "text → token ids"), ("decode", "token ids → text")):
        p = sub.add_parser(name, help=what)
        p.add_argument("--tokenizer", required=True, type=arguments.file_argument,
                       help="tokenizer file (gptspec JSON, tiktoken ranks or tokenizer.json)")
        p.add_argument("--input", type=arguments.stream_argument, default=None,
                       help="input file or pipe (default, or -: stdin)")
        p.add_argument("--output", type=arguments.stream_argument, default=None,
                       help="output file (default, or -: stdout)")
        if name == "encode":
            p.add_argument("--allow-special", action="store_true",
                           help="encode special tokens' text (<|endoftext|>) as their ids")
            p.add_argument("--json", action="store_true", help="write a JSON list")


def run(args: argparse.Namespace) -> int:
    if args.action != "train":  # before reading a large input
        if args.output is not None:
            arguments.output_file(args.output, "--output")
            arguments.not_an_input(args.output, "--output",
                                {"--tokenizer": args.tokenizer, "--input": args.input})
        else:
            standard_stream("stdout", "give --output FILE")
        if args.input is None:
            standard_stream("stdin", "give --input FILE")
    return {"train": _train, "encode": _encode, "decode": _decode}[args.action](args)


# --- input and output ---------------------------------------------------------------------


def _read_bytes(path: Path | None, what: str) -> bytes:
    flag = "--data" if what == "training data" else "--input"
    if path is None:
        stdin = standard_stream("stdin", f"give {flag} FILE").buffer
        return arguments.read_input(None, flag, stdin)
    arguments.input_file(path, flag, pipe=True)
    return arguments.read_input(path, flag)


def _read_text(path: Path | None, what: str) -> str:
    data = _read_bytes(path, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        name = "standard input" if path is None else str(path)
        raise CLIError(f"{what} {name} is not valid UTF-8 (byte {err.start}: "
                       f"{data[err.start:err.start + 1]!r})") from None


def _write(path: Path | None, data: bytes) -> None:
    if path is None:
        with writing_stdout():
            stdout = standard_stream("stdout", "give --output FILE")
            stdout.buffer.write(data)
            stdout.buffer.flush()
        return
    arguments.output_file(path, "--output")
    try:
        with arguments.training_run_lock(path, "--output"):
            write_bytes(path, data)
    except OSError as err:  # a full disk: the temporary file is removed, the target kept
        raise CLIError(f"--output: cannot write {path}: {err.strerror or err}") from None


def _load(path: Path):
    from gptspec.fast.tokenizer import Tokenizer, TokenizerError

    arguments.input_file(path, "--tokenizer")
    try:
        return Tokenizer.load(path)
    except TokenizerError as err:
        raise CLIError(str(err)) from None


# --- actions -------------------------------------------------------------------------------


def _train(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from gptspec.fast.tokenizer import (
        ENDOFTEXT,
        Tokenizer,
        TokenizerError,
        check_vocab_size,
        resolve_pattern,
    )

    special = () if args.no_endoftext else (ENDOFTEXT,)
    try:  # check the cheap things before reading a large file
        check_vocab_size(args.vocab_size, len(special))
    except TokenizerError as err:
        raise CLIError(str(err)) from None
    arguments.output_file(args.out, "--out")
    arguments.not_an_input(args.out, "--out", {"--data": args.data})
    try:
        resolve_pattern(args.pattern)
    except TokenizerError as err:
        raise CLIError(f"--pattern: {err}") from None
    text = _read_text(args.data, "training data")
    n_merges = args.vocab_size - 256 - len(special)
    with tqdm(total=n_merges, desc="learning merges", unit="merge", disable=args.quiet,
              file=sys.stderr) as bar:
        try:
            tok = Tokenizer.train(text, args.vocab_size, args.pattern, special,
                                  progress=lambda k: bar.update(k - bar.n))
        except TokenizerError as err:
            raise CLIError(str(err)) from None
    try:
        with arguments.training_run_lock(args.out, "--out"):
            tok.save(args.out, args.format)
    except OSError as err:
        raise CLIError(f"cannot write {args.out}: {err.strerror}") from None
    note = "" if len(tok.merges) == n_merges else " (the text ran out of pairs)"
    print(f"wrote {printable(args.out)}: {len(tok.merges)} merges, vocab size {tok.vocab_size}{note}",
          file=sys.stderr)
    return 0


def _encode(args: argparse.Namespace) -> int:
    from gptspec.fast.tokenizer import TokenizerError

    tok = _load(args.tokenizer)
    text = _read_text(args.input, "input")
    try:
        ids = tok.encode(text, allowed_special="all" if args.allow_special else ())
    except TokenizerError as err:
        raise CLIError(str(err)) from None
    out = json.dumps(ids) if args.json else " ".join(map(str, ids))
    _write(args.output, (out + "\n").encode("ascii"))
    return 0


def _parse_ids(text: str) -> list[int]:
    body = text.strip()
    if body.startswith("["):
        if not body.endswith("]"):
            raise CLIError("token ids: a JSON list that is not closed (truncated input?)")
        body = body[1:-1]
        items = body.split(",")
        if body.strip() and any(not item.strip() for item in items):  # "[1,,2]", "[1,]"
            n = next(k for k, item in enumerate(items) if not item.strip())
            raise CLIError(f"token ids: the JSON list has an empty item {n} (a stray comma)")
    ids = []
    for n, word in enumerate(body.replace(",", " ").split()):
        # ASCII digits only: int() would also read '1_0', '+5' and other scripts' digits
        if not DECIMAL.fullmatch(word):
            raise CLIError(f"token ids: item {n} is not an integer: {word[:20]!r}")
        ids.append(int(word))
    return ids


def _decode(args: argparse.Namespace) -> int:
    from gptspec.fast.tokenizer import TokenizerError

    tok = _load(args.tokenizer)
    ids = _parse_ids(_read_text(args.input, "input"))
    try:
        text = tok.decode(ids)
    except TokenizerError as err:
        raise CLIError(str(err)) from None
    _write(args.output, text.encode("utf-8"))
    return 0
