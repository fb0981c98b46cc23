"""``gptspec convert``: checkpoints to and from the transformers GPT-2 layout.

    gptspec convert --to-hf CHECKPOINT_DIR OUT_DIR    # a save_pretrained directory
    gptspec convert --from-hf HF_DIR OUT_DIR          # OUT_DIR/model.safetensors + tokenizer.json

The tokenizer travels with the weights (``--no-tokenizer``: the weights alone); one that
cannot be carried across is an error before anything is written. Both write safetensors
only, renamed into place, read weights as stored, and refuse an OUT_DIR that holds what
they would write or that another gptspec command writes (``arguments.training_run_lock``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from gptspec.cli import CLIError, arguments, printable, writing_stdout

DTYPES = ("float32", "float64", "bfloat16")
NO_TOKENIZER_HINT = "; --no-tokenizer converts the weights alone"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    direction = parser.add_mutually_exclusive_group(required=True)
    direction.add_argument("--to-hf", action="store_const", const="to-hf", dest="direction",
                           help="from a gptspec checkpoint to a transformers directory")
    direction.add_argument("--from-hf", action="store_const", const="from-hf",
                           dest="direction",
                           help="from a transformers GPT-2 directory to a gptspec checkpoint")
    parser.add_argument("source", metavar="SOURCE", help="CHECKPOINT_DIR or HF_DIR")
    parser.add_argument("out", metavar="OUT_DIR", help="where to write the converted model")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="dtype of the written weights (default float32; bfloat16 only "
                             "with --to-hf: checkpoints hold float32 or float64)")
    parser.add_argument("--no-tokenizer", action="store_true",
                        help="convert the weights alone, leaving any tokenizer behind")


def run(args: argparse.Namespace) -> int:
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise CLIError("transformers is not installed: pip install 'gptspec[interop]'") \
            from None
    hf_logging.disable_progress_bar()  # one line of output per conversion
    arguments.path_name(args.out, "OUT_DIR")  # before Path(), which reads "" as "."
    out = Path(args.out)
    with arguments.training_run_lock(out, "OUT_DIR", create=_writers_folder(args, out),
                                  check=lambda: _check_paths(args)):
        return _convert(args, out)


def _writers_folder(args: argparse.Namespace, out: Path) -> Path | None:
    """The folder whose lock a conversion holds when no lock file is there yet: one
    writer at a time. OUT_DIR named ``checkpoint`` is a fresh run's checkpoint folder to
    be: RUN's lock keeps a ``train --out RUN`` starting meanwhile from replacing it (the
    train is refused, naming this process, or later refuses a folder of other files).
    --from-hf fills OUT_DIR file by file: a second conversion into it is refused. (--to-hf
    renames a whole folder into place, which replaces only an empty one: the second of two
    is refused by that.)"""
    if out.name == "checkpoint":
        return out.parent
    return out if args.direction == "from-hf" else None


def _convert(args: argparse.Namespace, out: Path) -> int:
    from safetensors import SafetensorError

    from gptspec.fast.checkpoint import CheckpointError
    from gptspec.fast.hf_interop import InteropError, TokenizerInteropError

    try:
        if args.direction == "to-hf":
            import torch

            from gptspec.fast.checkpoint import newest_model
            from gptspec.fast.hf_interop import save_hf_dir

            folder, config, params = newest_model(args.source)  # NaN weights are refused
            source = (args.source if Path(args.source).suffix == ".safetensors"
                      else str(folder / "model.safetensors"))
            tokenizer = None if args.no_tokenizer else _checkpoint_tokenizer(source)
            try:
                save_hf_dir(out, params, config, dtype=getattr(torch, args.dtype),
                            tokenizer=tokenizer)
            except TokenizerInteropError as err:
                raise CLIError(f"{err}{NO_TOKENIZER_HINT}") from None
            except (OSError, SafetensorError) as err:  # a full disk: the temporary folder went
                raise CLIError(_cannot_write(out, err)) from None
            with_tokenizer = " and its tokenizer" if tokenizer is not None else ""
            with writing_stdout():
                print(f"wrote {printable(out)} (transformers GPT2LMHeadModel, {args.dtype}"
                      f"{with_tokenizer})", flush=True)
            if tokenizer is None and not args.no_tokenizer:  # after any error, not before
                _warn(f"{_tokenizer_file(source)} not found: wrote the model without a "
                      f"tokenizer")
        else:
            _from_hf(args, out)
    except (CheckpointError, InteropError) as err:
        raise CLIError(str(err)) from None
    return 0


def _check_paths(args: argparse.Namespace) -> None:
    """SOURCE readable and of the right kind, OUT_DIR a folder that can be made or filled."""
    from gptspec.fast.checkpoint import find_checkpoints

    arguments.path_name(args.source, "SOURCE")  # before Path(), which reads "" as "."
    source = Path(args.source)
    if args.direction == "to-hf" and not source.exists() and find_checkpoints(source):
        pass  # a killed save's newest copy beside it is read
    elif args.direction == "from-hf" or source.suffix != ".safetensors":
        arguments.input_dir(source, "SOURCE")
    else:
        arguments.input_file(source, "SOURCE")
    arguments.output_dir(args.out, "OUT_DIR")


def _warn(message: str) -> None:
    print(f"gptspec convert: warning: {printable(message)}", file=sys.stderr)


def _tokenizer_file(source: str) -> Path:
    from gptspec.fast.checkpoint import TOKENIZER_FILE, model_file

    return model_file(source).parent / TOKENIZER_FILE


def _checkpoint_tokenizer(source: str) -> Any:
    """The checkpoint's tokenizer, or None when it has none."""
    from gptspec.fast.tokenizer import Tokenizer

    file = _tokenizer_file(source)
    if not os.path.lexists(file):
        return None
    if not file.is_file():  # a FIFO would block the read; a folder is no tokenizer
        raise CLIError(f"{file} is not a regular file{NO_TOKENIZER_HINT}")
    try:
        return Tokenizer.load(file)
    except (ValueError, OSError) as err:  # TokenizerError is a ValueError
        raise CLIError(f"cannot load the tokenizer {file}: {str(err).splitlines()[0]}"
                       f"{NO_TOKENIZER_HINT}") from None


def _from_hf(args: argparse.Namespace, out: Path) -> None:
    import numpy as np
    from safetensors import SafetensorError

    from gptspec.fast.checkpoint import TOKENIZER_FILE, model_file, save_model
    from gptspec.fast.hf_interop import (
        TokenizerInteropError,
        check_tokenizer_fits,
        load_hf_dir,
        load_hf_tokenizer,
    )

    if args.dtype == "bfloat16":
        raise CLIError("--dtype bfloat16 is for --to-hf only: gptspec checkpoints "
                       "hold float32 or float64")
    targets = [model_file(out)] + ([] if args.no_tokenizer else [out / TOKENIZER_FILE])
    for target in targets:  # nothing already in OUT_DIR is replaced
        if target.exists():
            raise CLIError(f"{target} already exists; choose another OUT_DIR")
    source = Path(args.source)
    if not source.is_dir():
        raise CLIError(f"{source} is not a directory")
    config, params = load_hf_dir(source)
    tokenizer = None
    if not args.no_tokenizer:
        try:  # read and check it before anything is written
            tokenizer = load_hf_tokenizer(source)
            if tokenizer is not None:
                check_tokenizer_fits(config, tokenizer)
        except TokenizerInteropError as err:
            raise CLIError(f"{err}{NO_TOKENIZER_HINT}") from None
    # read as stored (float64 holds every stored float type): written in --dtype, which
    # rounds only float64 weights that float32 cannot hold, as the message then says
    written = _cast(params, args.dtype)
    exact = all(np.array_equal(written[name], value) for name, value in params.items())
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        if tokenizer is not None:
            tokenizer.save(out / TOKENIZER_FILE)  # atomic: temporary name, then rename
        save_model(out, written, config)  # refuses NaN or infinite weights
    except BaseException as err:
        # all or nothing: no tokenizer left without its model, no folder we made
        if tokenizer is not None:
            (out / TOKENIZER_FILE).unlink(missing_ok=True)
        if created and not any(out.iterdir()):
            out.rmdir()
        if isinstance(err, (OSError, SafetensorError)):  # a full disk
            raise CLIError(_cannot_write(out, err)) from None
        raise
    with_tokenizer = f" and {printable(out / TOKENIZER_FILE)}" if tokenizer is not None else ""
    rounded = "" if exact else (f"; the source's float64 weights rounded to {args.dtype}: "
                                "--dtype float64 keeps them exact")
    with writing_stdout():
        print(f"wrote {printable(model_file(out))} ({args.dtype}{rounded}){with_tokenizer}",
              flush=True)
    if tokenizer is None and not args.no_tokenizer:
        _warn(f"{source} holds no tokenizer (tokenizer.json, or vocab.json + merges.txt): "
              f"wrote the weights only; gptspec generate needs {out / TOKENIZER_FILE}")


def _cannot_write(out: Path, err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    reason = getattr(err, "strerror", None) or text
    return f"OUT_DIR: cannot write {out}: {reason}; nothing was written"


def _cast(params: dict, dtype: str) -> dict:
    return {k: v.astype(dtype) for k, v in params.items()}
