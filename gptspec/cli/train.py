"""``gptspec train``: train a model from a preset or flags on a text or token file.

    gptspec train                                   # Python's standard library, byte level
    gptspec train --preset shakespeare-char --data input.txt --out out/shakespeare
    gptspec train --out out/shakespeare --resume    # continue where it stopped
    torchrun --nproc_per_node 2 -m gptspec train …  # data-parallel (DDP)

The output directory gets ``checkpoint/`` (model.safetensors, optimizer.safetensors,
state.json, tokenizer.json; ``gptspec generate --checkpoint OUT/checkpoint``), the
tokenized corpus ``tokens.bin`` (memory-mapped), and ``loss.png``. On a CPU shared with
other work, ``OMP_NUM_THREADS=1`` is often faster than oversubscribed threads; the losses
are the same either way.
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np

from gptspec.cli import CLIError, error_line

MODEL_FLAGS: dict[str, type] = {"vocab_size": int, "n_ctx": int, "d_model": int, "n_layers": int,
               "n_heads": int, "d_ff": int}
TRAIN_FLAGS: dict[str, tuple[str, type]] = {"steps": ("max_steps", int), "batch_size": ("batch_size", int),
               "lr": ("lr", float), "min_lr": ("min_lr", float),
               "warmup": ("warmup_steps", int), "weight_decay": ("weight_decay", float),
               "grad_clip": ("grad_clip", float), "grad_accum": ("grad_accum", int),
               "eval_interval": ("eval_interval", int), "eval_batches": ("eval_batches", int),
               "checkpoint_interval": ("checkpoint_interval", int), "seed": ("seed", int),
               "device": ("device", str), "precision": ("precision", str)}
STDLIB_MB = 8  # how much of the standard library the out-of-the-box run reads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="shakespeare-char",
                        help="model preset (default: shakespeare-char)")
    for name, kind in MODEL_FLAGS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None,
                            help=f"override the preset's {name}")
    parser.add_argument("--data", type=Path, default=None,
                        help="UTF-8 text, or token ids (.bin raw uint16/uint32, .npy); default: "
                             "the .py files of Python's standard library")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="tokenizer file to load (default: byte level, 256 tokens)")
    parser.add_argument("--train-tokenizer", type=int, default=None, metavar="VOCAB",
                        help="train a BPE tokenizer of this vocabulary size on the text first")
    parser.add_argument("--out", type=Path, default=Path("out"), help="output directory")
    parser.add_argument("--resume", action="store_true",
                        help="continue from OUT/checkpoint (same data, same settings)")
    for flag, (field, kind) in TRAIN_FLAGS.items():
        parser.add_argument(f"--{flag.replace('_', '-')}", type=kind, default=None,
                            help=f"training setting {field}")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _stdlib_text() -> tuple[str, str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    parts, size = [], 0
    for file in sorted(root.rglob("*.py")):
        if "site-packages" in file.parts or "test" in file.parts:
            continue
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        parts.append(text)
        size += len(text)
        if size > STDLIB_MB * 2**20:
            break
    if not parts:
        raise CLIError(f"no .py files found under {root}; pass --data")
    return "\n".join(parts), f"the .py files of Python's standard library ({root})"


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise CLIError(f"data file {str(path)!r} not found")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise CLIError(f"data file {str(path)!r} is not valid UTF-8 (byte {err.start})") from None


def _tokenizer(args: argparse.Namespace, text: str | None) -> Any:
    from gptspec.fast.tokenizer import Tokenizer

    if args.tokenizer is not None and args.train_tokenizer is not None:
        raise CLIError("give --tokenizer or --train-tokenizer, not both")
    if args.tokenizer is not None:
        if not args.tokenizer.is_file():
            raise CLIError(f"tokenizer file {str(args.tokenizer)!r} not found")
        try:
            return Tokenizer.load(args.tokenizer)
        except Exception as err:
            raise CLIError(f"cannot load the tokenizer {str(args.tokenizer)!r}: {err}") from None
    if args.train_tokenizer is not None:
        if text is None:
            raise CLIError("--train-tokenizer needs a text corpus, not a token file")
        try:
            return Tokenizer.train(text, args.train_tokenizer)
        except ValueError as err:
            raise CLIError(f"cannot train the tokenizer: {err}") from None
    return Tokenizer.byte_level()


def _encode(tokenizer: Any, text: str) -> np.ndarray:
    if not tokenizer.merges and not tokenizer.special_tokens:  # byte level: ids are the bytes
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
    return np.asarray(tokenizer.encode_ordinary(text), dtype=np.int64)


def _config(args: argparse.Namespace, tokenizer: Any):
    from gptspec.spec.config import ConfigError, preset

    try:
        overrides = {k: getattr(args, k) for k in MODEL_FLAGS if getattr(args, k) is not None}
        config = preset(args.preset).replace(**overrides)
    except ConfigError as err:
        raise CLIError(str(err)) from None
    if tokenizer.vocab_size > config.vocab_size:
        raise CLIError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model's "
                       f"vocab_size is {config.vocab_size}; pass --vocab-size "
                       f"{tokenizer.vocab_size} or a smaller tokenizer")
    return config


def _settings(args: argparse.Namespace, base: dict | None = None):
    from gptspec.fast.train import TrainSettings

    values = dict(base or {})
    for flag, (field, _) in TRAIN_FLAGS.items():
        if getattr(args, flag) is not None:
            values[field] = getattr(args, flag)
    try:
        return TrainSettings.from_dict(values)
    except ValueError as err:
        raise CLIError(str(err)) from None


def _prepare_data(args: argparse.Namespace, out: Path):
    """(tokenizer, config, memory-mapped tokens, description) for a fresh run."""
    from gptspec.fast.data import DataError, open_tokens, write_tokens

    data = args.data
    if data is not None and data.suffix in (".bin", ".npy"):
        tokenizer = _tokenizer(args, None)
        config = _config(args, tokenizer)
        try:
            return tokenizer, config, open_tokens(data, config.vocab_size), str(data)
        except DataError as err:
            raise CLIError(str(err)) from None
    text, source = (_read_text(data), str(data)) if data is not None else _stdlib_text()
    if not text:
        raise CLIError(f"the corpus {source} is empty")
    tokenizer = _tokenizer(args, text)
    config = _config(args, tokenizer)
    ids = _encode(tokenizer, text)
    tokens = write_tokens(out / "tokens.bin", ids, config.vocab_size)
    return tokenizer, config, open_tokens(tokens, config.vocab_size), source


def run(args: argparse.Namespace) -> int:
    from gptspec.fast.checkpoint import CheckpointError
    from gptspec.fast.data import DataError, TokenData, open_tokens
    from gptspec.fast.train import Trainer, TrainingDiverged, init_distributed

    out: Path = args.out
    checkpoint = out / "checkpoint"
    if args.resume:
        if args.data is not None or args.tokenizer is not None or args.train_tokenizer:
            raise CLIError("--resume reads the data and tokenizer of the checkpointed run; "
                           "do not pass --data or a tokenizer")
        try:
            from gptspec.fast.checkpoint import load_training_checkpoint

            config, _, _, state, tokenizer = load_training_checkpoint(checkpoint)
            if tokenizer.vocab_size > config.vocab_size:
                raise CLIError(f"{checkpoint}: the tokenizer has {tokenizer.vocab_size} tokens, "
                               f"the model only {config.vocab_size}")
            tokens = open_tokens(Path(state["data"]["tokens"]), config.vocab_size,
                                 state["data"].get("dtype"))
            if len(tokens) != state["data"]["n_tokens"]:
                raise CLIError(f"the token file {state['data']['tokens']} changed since the "
                               "checkpoint was written")
        except (CheckpointError, DataError) as err:
            raise CLIError(str(err)) from None
        except KeyError as err:
            raise CLIError(f"{checkpoint}/state.json lacks {err}") from None
        settings = _settings(args, state["settings"])
        rank, world, device = init_distributed(settings.device)
        settings.device = device
        try:
            data = TokenData.split(tokens, config.n_ctx)
            trainer = Trainer.resume(checkpoint, data, {k: v for k, v in vars(settings).items()})
        except (CheckpointError, DataError) as err:
            raise CLIError(str(err)) from None
        data_state = state["data"]
        source = data_state["source"]
    else:
        if out.exists() and (checkpoint / "state.json").exists():
            raise CLIError(f"{out} already holds a training run; pass --resume to continue it "
                           "or choose another --out")
        out.mkdir(parents=True, exist_ok=True)
        tokenizer, config, tokens, source = _prepare_data(args, out)
        settings = _settings(args)
        rank, world, device = init_distributed(settings.device)
        settings.device = device
        try:
            data = TokenData.split(tokens, config.n_ctx)
        except DataError as err:
            raise CLIError(f"{source}: {err}") from None
        trainer = Trainer(config, settings, data, tokenizer)
        data_state = {"source": source, "tokens": str(Path(tokens.filename).resolve())
                      if getattr(tokens, "filename", None) else str(args.data),
                      "n_tokens": int(len(tokens)), "dtype": str(tokens.dtype)}
    trainer.extra_state = {"data": data_state}
    if rank == 0:
        print(f"training {config.n_layers} layers × d_model {config.d_model} "
              f"({sum(p.numel() for p in trainer.model.parameters()):,} parameters) on "
              f"{len(tokens):,} tokens of {source}; {trainer.tokens_per_step:,} tokens per step"
              f"{f' on {world} processes' if world > 1 else ''}, device {settings.device}",
              flush=True)
    try:
        status = trainer.run(out, progress=not args.no_progress)
    except TrainingDiverged as err:
        error = CLIError(f"{err}; stopped without saving — the last good checkpoint "
                         f"is kept in {checkpoint}")
        if world == 1:
            raise error from None
        # Every process stopped at the same step (Trainer._stop_unless_finite). Rank 0 says
        # so once; the others exit only after it has, because torchrun ends the whole group
        # as soon as one process fails, which could cut rank 0 off before its line.
        if rank == 0:
            print(error_line("train", error), file=sys.stderr, flush=True)
        import torch.distributed as dist

        dist.barrier()
        return 2
    if rank != 0:
        return 0
    if status == "interrupted":
        print(f"interrupted at step {trainer.step_count}; checkpoint saved in {checkpoint}; "
              f"continue with: gptspec train --out {out} --resume", flush=True)
        return 130
    val = trainer.history["val"][-1][1] if trainer.history["val"] else float("nan")
    print(f"done: {trainer.step_count} steps, validation loss {val:.4f}, "
          f"{trainer.elapsed:.1f} s of training; checkpoint in {checkpoint}, loss curve in "
          f"{out / 'loss.png'}", flush=True)
    return 0
