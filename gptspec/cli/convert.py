"""``gptspec convert``: checkpoints to and from the transformers GPT-2 layout.

    gptspec convert --to-hf CHECKPOINT_DIR OUT_DIR    # a save_pretrained directory
    gptspec convert --from-hf HF_DIR OUT_DIR          # OUT_DIR/model.safetensors

Both write safetensors only, under a temporary name renamed into place, and refuse an
OUT_DIR that already holds a model rather than overwrite it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gptspec.cli import CLIError

DTYPES = ("float32", "float64", "bfloat16")


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


def run(args: argparse.Namespace) -> int:
    from gptspec.fast.checkpoint import CheckpointError, load_model, model_file, save_model
    from gptspec.fast.hf_interop import InteropError, load_hf_dir, save_hf_dir

    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise CLIError("transformers is not installed: pip install 'gptspec[interop]'") \
            from None
    hf_logging.disable_progress_bar()  # one line of output per conversion
    out = Path(args.out)
    try:
        if args.direction == "to-hf":
            import torch

            config, params = load_model(args.source)
            save_hf_dir(out, config, params, dtype=getattr(torch, args.dtype))
            print(f"wrote {out} (transformers GPT2LMHeadModel, {args.dtype})")
        else:
            if args.dtype == "bfloat16":
                raise CLIError("--dtype bfloat16 is for --to-hf only: gptspec checkpoints "
                               "hold float32 or float64")
            if model_file(out).exists():
                raise CLIError(f"{model_file(out)} already exists; choose another OUT_DIR")
            source = Path(args.source)
            if not source.is_dir():
                raise CLIError(f"{source} is not a directory")
            config, params = load_hf_dir(source)
            save_model(out, config, _cast(params, args.dtype))
            print(f"wrote {model_file(out)} ({args.dtype})")
    except (CheckpointError, InteropError) as err:
        raise CLIError(str(err)) from None
    return 0


def _cast(params: dict, dtype: str) -> dict:
    return {k: v.astype(dtype) for k, v in params.items()}
