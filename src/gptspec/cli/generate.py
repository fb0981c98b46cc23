"""``gptspec generate``: continue a prompt from a checkpoint, streaming text to stdout.

    gptspec generate --checkpoint DIR --prompt TEXT [--max-new-tokens N]
                     [--temperature T] [--top-k K] [--top-p P] [--seed S]

Temperature 0 is greedy decoding. A prompt longer than the model's context is cropped
to its last n_ctx tokens, with a warning on stderr. Generation stops at the end-of-text
token (not printed) or after N tokens.
"""

from __future__ import annotations

import argparse
import codecs
import math
import sys
from pathlib import Path
from typing import Any

from gptspec.cli import CLIError, arguments, printable, standard_stream, writing_stdout

BYTES_PER_TOKEN = 36  # a generated id as Python keeps it: its int and its list slot


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, metavar="DIR",
                        help="checkpoint directory (model.safetensors and tokenizer.json)")
    parser.add_argument("--prompt", required=True, metavar="TEXT", help="the text to continue")
    parser.add_argument("--max-new-tokens", type=int, default=100, metavar="N",
                        help="most tokens to generate (default 100)")
    parser.add_argument("--temperature", type=float, default=1.0, metavar="T",
                        help="softmax temperature ≥ 0; 0 is greedy decoding (default 1)")
    parser.add_argument("--top-k", type=int, default=None, metavar="K",
                        help="sample only among the K most likely tokens (K ≥ 1)")
    parser.add_argument("--top-p", type=float, default=None, metavar="P",
                        help="nucleus sampling: the smallest set of mass ≥ P, 0 < P ≤ 1")
    parser.add_argument("--seed", type=int, default=None, metavar="S",
                        help="seed of the sampler: the same seed gives the same text")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1, …")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16",
                                                               "float64"))


def check_settings(args: argparse.Namespace) -> None:
    """Refuse settings that define no distribution, naming the option."""
    arguments.integer(args.max_new_tokens, "--max-new-tokens", low=0)
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise CLIError(f"--temperature must be a finite number ≥ 0 (0 is greedy), "
                       f"got {args.temperature}{arguments.beyond_floats(args.temperature)}")
    if args.top_k is not None and args.top_k <= 0:
        raise CLIError(f"--top-k must be a positive integer, got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise CLIError(f"--top-p must lie in (0, 1], got {args.top_p}")
    arguments.seed(args.seed)
    arguments.fits_in_memory(BYTES_PER_TOKEN * args.max_new_tokens,
                          f"--max-new-tokens {args.max_new_tokens}: the ids it keeps")


def load_checkpoint(directory: str) -> tuple[Any, Any, Any]:
    """(config, params, tokenizer) of a checkpoint directory, or a one-line CLIError."""
    from gptspec.fast.checkpoint import (
        TokenizerFileMissing,
        find_checkpoints,
        load_generation_checkpoint,
    )

    arguments.path_name(directory, "--checkpoint")
    path = Path(directory)
    if not path.exists() and not find_checkpoints(path):  # a killed save may leave a copy
        raise CLIError(f"checkpoint directory {directory!r} does not exist")
    if path.exists() and not path.is_dir():
        raise CLIError(f"checkpoint {directory!r} is not a directory")
    # the newest complete copy (a killed save's, or one a running save is replacing):
    # model and tokenizer are read from one folder, whatever is renamed meanwhile
    try:
        path, config, params, tokenizer = load_generation_checkpoint(path)
    except TokenizerFileMissing as err:
        raise CLIError(f"cannot load the tokenizer of {directory!r}: {_one_line(err)}") from None
    except (ValueError, OSError) as err:  # CheckpointError is a ValueError
        raise CLIError(f"cannot load the model from {directory!r}: {_one_line(err)}") from None
    return config, params, tokenizer


def _one_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0]


class TextStream:
    """Writes tokens as text as they arrive; a character split across tokens is held back
    until its last byte arrives (an incremental UTF-8 decoder)."""

    def __init__(self, tokenizer: Any, out: Any) -> None:
        self.tokenizer = tokenizer
        self.out = out
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def write(self, token: int) -> None:
        try:
            data = self.tokenizer.decode_bytes([token])
        except Exception:  # an id the tokenizer does not define (a model with spare ids)
            data = "\ufffd".encode()
        self.out.write(self.decoder.decode(data))
        self.out.flush()

    def close(self) -> None:
        self.out.write(self.decoder.decode(b"", final=True))
        self.out.flush()


def run(args: argparse.Namespace) -> int:
    check_settings(args)
    stdout = standard_stream("stdout", "generate writes the text there")

    from gptspec.fast.generate import stream
    from gptspec.fast.model import GPT
    from gptspec.fast.sampling import NonFiniteLogits, Sampling

    arguments.device(args.device)
    config, params, tokenizer = load_checkpoint(args.checkpoint)
    if tokenizer.vocab_size > config.vocab_size:
        raise CLIError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model only "
                       f"{config.vocab_size}: they do not belong together")
    try:  # a byte the locale (LC_ALL=C: ASCII) cannot decode reaches Python as a lone
        # surrogate: the argument's own bytes, read as UTF-8 (or the byte named)
        args.prompt = args.prompt.encode("utf-8", "surrogateescape").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError) as err:
        raise CLIError(f"--prompt is not valid UTF-8 (byte {err.start}: "
                       f"{err.object[err.start:err.start + 1]!r})") from None
    special = next((t for t in getattr(tokenizer, "special_tokens", {}) if t in args.prompt), None)
    if special is not None:  # the library's remedy (allowed_special) is no flag of generate's
        raise CLIError(f"--prompt contains the special token '{printable(special)}', which "
                       "generate does not read in a prompt; remove it")
    try:
        prompt = tokenizer.encode(args.prompt)
    except ValueError as err:
        raise CLIError(f"cannot encode the prompt: {_one_line(err)}") from None
    eot = tokenizer.eot_token
    if not prompt:
        if eot is None:
            raise CLIError("the prompt is empty and the tokenizer has no end-of-text token "
                           "to start from")
        prompt = [eot]  # an empty prompt starts a new document
    if len(prompt) > config.n_ctx:
        print(f"gptspec generate: warning: the prompt has {len(prompt)} tokens, more than the "
              f"context of {config.n_ctx}; keeping its last {config.n_ctx}", file=sys.stderr)
        prompt = prompt[-config.n_ctx:]
    try:
        model = GPT.from_parameters(params, config, device=args.device, dtype=args.dtype)
    except ValueError as err:
        raise CLIError(f"cannot build the model: {_one_line(err)}") from None
    model.requires_grad_(False)
    sampling = Sampling(args.temperature, args.top_k, args.top_p)

    out = TextStream(tokenizer, stdout)
    with writing_stdout():
        if args.prompt:
            stdout.write(args.prompt)
        try:
            for step in stream(model, [prompt], args.max_new_tokens, sampling, eot_token=eot,
                               seed=args.seed):
                token = step.tokens[0]
                if token is not None and token != eot:
                    out.write(token)
        except NonFiniteLogits as err:
            stdout.write("\n")
            raise CLIError(str(err)) from None
        out.close()
        stdout.write("\n")
    return 0
