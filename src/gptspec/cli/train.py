"""``gptspec train``: train a model from a preset or flags on a text or token file.

    gptspec train                                   # Python's standard library, byte level
    gptspec train --preset shakespeare-char --data input.txt --out out/shakespeare
    gptspec train --out out/shakespeare --resume    # continue where it stopped
    torchrun --nproc_per_node 2 -m gptspec train …  # data-parallel (DDP)

OUT gets ``checkpoint/`` (weights, optimizer, state.json, tokenizer.json: what
``gptspec generate --checkpoint`` reads), ``tokens.bin`` (memory-mapped), ``loss.png``,
and ``.train.lock``: one run writes OUT at a time; a second is refused, naming the pid.
On a shared CPU, ``OMP_NUM_THREADS=1`` is often faster than oversubscribed threads.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np

from gptspec.cli import CLIError, checks, error_line, printable, writing_stdout

MODEL_FLAGS: dict[str, type] = {"vocab_size": int, "n_ctx": int, "d_model": int, "n_layers": int,
               "n_heads": int, "d_ff": int}
HISTORY_BYTES_PER_STEP = 136  # [step, loss] as Python keeps it (measured with tracemalloc)
EVAL_BYTES_PER_BATCH = 32  # a float and its list slot: an evaluation keeps each batch's loss
TEMPORARY_FILES = ("loss.png", "tokens.bin")  # written beside their targets (atomic_files)
TRAIN_FLAGS: dict[str, tuple[str, type]] = {"steps": ("max_steps", int), "batch_size": ("batch_size", int),
               "lr": ("lr", float), "min_lr": ("min_lr", float),
               "warmup": ("warmup_steps", int), "weight_decay": ("weight_decay", float),
               "grad_clip": ("grad_clip", float), "grad_accum": ("grad_accum", int),
               "eval_interval": ("eval_interval", int), "eval_batches": ("eval_batches", int),
               "checkpoint_interval": ("checkpoint_interval", int), "seed": ("seed", int),
               "device": ("device", str), "precision": ("precision", str)}
DEFAULT_PRESET = "shakespeare-char"
STDLIB_MB = 8  # how much of the standard library the out-of-the-box run reads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default=None,
                        help=f"model preset (default: {DEFAULT_PRESET})")
    for name, kind in MODEL_FLAGS.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None,
                            help=f"override the preset's {name}")
    parser.add_argument("--data", type=checks.file_argument, default=None,
                        help="UTF-8 text, or token ids (.bin raw uint16/uint32, .npy); default: "
                             "the .py files of Python's standard library")
    parser.add_argument("--tokenizer", type=checks.file_argument, default=None,
                        help="tokenizer file to load (default: byte level, 256 tokens)")
    parser.add_argument("--train-tokenizer", type=int, default=None, metavar="VOCAB",
                        help="train a BPE tokenizer of this vocabulary size on the text first")
    parser.add_argument("--out", type=checks.path_argument, default=Path("out"), help="output directory")
    parser.add_argument("--resume", action="store_true",
                        help="continue from OUT/checkpoint (same data, same settings)")
    for flag, (field, kind) in TRAIN_FLAGS.items():
        parser.add_argument(f"--{flag.replace('_', '-')}", type=kind, default=None,
                            help=f"training setting {field}")
    parser.add_argument("--compile", action="store_true", default=None,
                        help="compile the forward and the loss with torch.compile (one "
                             "process; pays on CUDA: about 2x a GPT-2-small step there)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def stdlib_text() -> tuple[str, str]:
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


def read_text(path: Path) -> str:
    checks.input_file(path, "--data")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise CLIError(f"data file {str(path)!r} is not valid UTF-8 (byte {err.start})") from None
    except OSError as err:  # a file that opens but cannot be read (/proc/self/mem, EIO)
        raise CLIError(f"--data: cannot read {path}: {err.strerror}") from None


def _tokenizer(args: argparse.Namespace, text: str | None) -> Any:
    from gptspec.fast.tokenizer import Tokenizer

    if args.tokenizer is not None and args.train_tokenizer is not None:
        raise CLIError("give --tokenizer or --train-tokenizer, not both")
    if args.tokenizer is not None:
        checks.input_file(args.tokenizer, "--tokenizer")
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


def _kept(checkpoint: Path, what: str) -> str:
    """What a run that stopped on an error leaves: its last checkpoint, or none (it
    stopped before the first save, and there is nothing to resume)."""
    from gptspec.fast.checkpoint import find_checkpoints

    if find_checkpoints(checkpoint):
        return f"the last {what} checkpoint is kept in {checkpoint}"
    return f"no checkpoint had been saved yet in {checkpoint}"


def _where_saved(trainer: Any, checkpoint: Path, out: Path) -> str:
    """Where an interrupted run's work is, as it is: saved by this run, kept from an
    earlier one (no step was taken), or nowhere yet."""
    from gptspec.fast.checkpoint import find_checkpoints

    resume = f"continue with: gptspec train --out {out} --resume"
    if trainer.saved_at is not None:
        return f"checkpoint saved in {checkpoint} (step {trainer.saved_at}); {resume}"
    if find_checkpoints(checkpoint):
        return f"no step was taken; the checkpoint in {checkpoint} is as it was; {resume}"
    return ("no checkpoint was saved (stopped before the first step); to train, run the "
            "same command again")


def _encode(tokenizer: Any, text: str) -> np.ndarray:
    if not tokenizer.merges and not tokenizer.special_tokens:  # byte level: ids are the bytes
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int64)
    return np.asarray(tokenizer.encode_ordinary(text), dtype=np.int64)


def _config(args: argparse.Namespace, tokenizer: Any):
    from gptspec.spec.config import ConfigError

    try:
        config = _model_config(args)
    except ConfigError as err:
        raise CLIError(str(err)) from None
    if tokenizer.vocab_size > config.vocab_size:
        raise CLIError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model's "
                       f"vocab_size is {config.vocab_size}; pass --vocab-size "
                       f"{tokenizer.vocab_size} or a smaller tokenizer")
    return config


def _settings(args: argparse.Namespace, base: dict | None = None, where: str = ""):
    from gptspec.fast.train import TrainSettings

    values = dict(base or {})
    for flag, (field, _) in TRAIN_FLAGS.items():
        if getattr(args, flag) is not None:
            values[field] = getattr(args, flag)
    if getattr(args, "compile", None):  # on --resume, without the flag, as the run was
        values["compile"] = True
    try:
        settings = TrainSettings.from_dict(values)
    except (ValueError, TypeError) as err:  # TypeError: a state.json with odd values
        raise CLIError(f"{where}{err}") from None
    # the flag is checked up front; a state.json's value here (an evaluation never ending)
    checks.fits_in_memory(EVAL_BYTES_PER_BATCH * settings.eval_batches,
                          f"{where}eval_batches {settings.eval_batches}: the losses an "
                          "evaluation keeps (one a batch)")
    return settings


def _claim(out: Path, locks: list, resume: bool = False) -> None:
    """Make OUT this process's to write (refused if another live run writes it), then
    remove what killed runs left there; every later write happens under the lock."""
    from gptspec.fast.checkpoint import find_checkpoints, recover_checkpoint
    from gptspec.fast.run_lock import RunLock, RunLocked, remove_stale_temporaries

    out.mkdir(parents=True, exist_ok=True)
    if locks or os.environ.get("RANK", "0") != "0":  # held; under torchrun rank 0 writes
        return
    try:
        locks.append(RunLock(out))
    except RunLocked as err:
        raise CLIError(str(err)) from None
    except OSError as err:
        raise CLIError(f"--out: cannot lock {out}: {err.strerror}") from None
    if not resume and find_checkpoints(out / "checkpoint"):
        # a run that ended between the check in run() and the lock
        raise CLIError(f"{out} already holds a training run; pass --resume to continue it "
                       "or choose another --out")
    # under torchrun every rank writes tokens.bin (the same bytes) at this moment: only
    # the files rank 0 alone writes are a killed run's
    together = os.environ.get("WORLD_SIZE", "1") not in ("", "1")
    remove_stale_temporaries(out, ("loss.png",) if together else TEMPORARY_FILES)
    recover_checkpoint(out / "checkpoint")  # the temporary folders of killed saves go


def _prepare_data(args: argparse.Namespace, out: Path, locks: list):
    """(tokenizer, config, memory-mapped tokens, description) for a fresh run."""
    from gptspec.fast.data import DataError, open_tokens, write_tokens

    data = args.data
    if data is not None and data.suffix in (".bin", ".npy"):
        tokenizer = _tokenizer(args, None)
        config = _config(args, tokenizer)
        try:
            tokens = open_tokens(data, config.vocab_size)
        except DataError as err:
            raise CLIError(str(err)) from None
        _claim(out, locks)
        try:
            return tokenizer, config, tokens, str(data)
        except DataError as err:
            raise CLIError(str(err)) from None
    text, source = (read_text(data), str(data)) if data is not None else stdlib_text()
    if not text:
        raise CLIError(f"the corpus {source} is empty")
    tokenizer = _tokenizer(args, text)
    config = _config(args, tokenizer)
    ids = _encode(tokenizer, text)
    from gptspec.fast.data import TokenData

    try:  # a corpus too short to split is refused before OUT and tokens.bin are made
        TokenData.split(ids, config.n_ctx)
    except DataError as err:
        raise CLIError(f"{source}: {err}") from None
    _claim(out, locks)  # makes OUT only now: a refused input leaves no folder
    written = write_tokens(out / "tokens.bin", ids, config.vocab_size)
    return tokenizer, config, open_tokens(written, config.vocab_size), source


def run(args: argparse.Namespace) -> int:
    locks: list = []  # the run directory's lock, held until the run ends (_claim)
    try:
        return _run(args, locks)
    finally:
        for lock in locks:
            lock.release()


def _run(args: argparse.Namespace, locks: list) -> int:
    from gptspec.fast.checkpoint import CheckpointError
    from gptspec.fast.data import DataError, TokenData, open_tokens
    from gptspec.fast.train import Trainer, TrainingDiverged, init_distributed

    out: Path = args.out
    checkpoint = out / "checkpoint"
    check_arguments(args)
    if args.resume:
        if args.data is not None or args.tokenizer is not None or args.train_tokenizer:
            raise CLIError("--resume reads the data and tokenizer of the checkpointed run; "
                           "do not pass --data or a tokenizer")
        from gptspec.fast.checkpoint import find_checkpoints, load_training_checkpoint

        if not out.is_dir() or not (checkpoint.exists() or find_checkpoints(checkpoint)):
            raise CLIError(f"no training checkpoint to resume in {out} ({checkpoint} not "
                           "found)")
        _claim(out, locks, resume=True)  # before reading: another writer may be mid-save
        try:
            config, _, _, state, tokenizer = load_training_checkpoint(checkpoint)
            _check_model_flags_agree(args, config, checkpoint)
            if tokenizer.vocab_size > config.vocab_size:
                raise CLIError(f"{checkpoint}: the tokenizer has {tokenizer.vocab_size} tokens, "
                               f"the model only {config.vocab_size}")
            if "data" not in state:
                raise CLIError(f"{checkpoint}/state.json does not say which data it was "
                               "trained on")
            tokens = open_tokens(_tokens_path(out, state["data"]["tokens"]), config.vocab_size,
                                 state["data"].get("dtype"))
            if len(tokens) != state["data"]["n_tokens"]:
                raise CLIError(f"the token file {state['data']['tokens']} changed since the "
                               "checkpoint was written")
        except (CheckpointError, DataError) as err:
            raise CLIError(str(err)) from None
        except KeyError as err:
            raise CLIError(f"{checkpoint}/state.json lacks {err}") from None
        if args.steps is not None and args.steps < state["step"]:
            raise CLIError(f"--steps {args.steps} is below the checkpoint's step "
                           f"{state['step']} ({checkpoint}); --resume trains on to a larger "
                           "--steps")
        if checkpoint.is_dir():  # before training, not at the first save
            checks.output_dir(checkpoint, "--out")
        settings = _settings(args, state["settings"], f"{checkpoint / 'state.json'}: ")
        _check_memory(config, settings.batch_size, settings.grad_accum)
        checks.device(settings.device, "--device" if args.device else
                      f"the checkpoint's device ({checkpoint}/state.json)")
        rank, world, device = init_distributed(settings.device)
        settings.device = device
        try:
            data = TokenData.split(tokens, config.n_ctx)
            trainer = Trainer.resume(checkpoint, data, {k: v for k, v in vars(settings).items()})
        except (CheckpointError, DataError) as err:
            raise CLIError(str(err)) from None
        data_state = state["data"]
        source = printable(data_state["source"])
    else:
        from gptspec.fast.checkpoint import find_checkpoints

        if out.is_dir():  # a live writer there is named, whatever it has written yet
            _claim(out, locks)
        if out.exists() and ((checkpoint / "state.json").exists() or find_checkpoints(checkpoint)):
            raise CLIError(f"{out} already holds a training run; pass --resume to continue it "
                           "or choose another --out")
        settings = _settings(args)  # before the data is read: a bad setting costs nothing
        checks.device(settings.device)
        _check_memory(_model_config(args), settings.batch_size, settings.grad_accum)
        tokenizer, config, tokens, source = _prepare_data(args, out, locks)  # makes OUT
        rank, world, device = init_distributed(settings.device)
        settings.device = device
        try:
            data = TokenData.split(tokens, config.n_ctx)
        except DataError as err:
            raise CLIError(f"{source}: {err}") from None
        trainer = Trainer(config, settings, data, tokenizer)
        tokens_file = Path(tokens.filename) if getattr(tokens, "filename", None) else args.data
        data_state = {"source": source, "tokens": _stored_path(out, tokens_file),
                      "n_tokens": int(len(tokens)), "dtype": str(tokens.dtype)}
    trainer.extra_state = {"data": data_state}
    if rank == 0:
        with writing_stdout():
            print(f"training {config.n_layers} layers × d_model {config.d_model} "
                  f"({sum(p.numel() for p in trainer.model.parameters()):,} parameters) on "
                  f"{len(tokens):,} tokens of {source}; {trainer.tokens_per_step:,} tokens "
                  f"per step{f' on {world} processes' if world > 1 else ''}, device "
                  f"{settings.device}", flush=True)
    from gptspec.fast.train import Interrupted, stop_on_signals

    interrupted: list[int] = []
    try:
        with stop_on_signals():
            try:
                status = trainer.run(out, progress=not args.no_progress and sys.stderr is not None)
            except Interrupted as signal_during_save:  # arrived as a save ended
                interrupted.append(signal_during_save.signum)
                status = "interrupted"
    except OSError as err:  # disk full, permission lost: what was written before is kept
        raise CLIError(f"cannot write the checkpoint: {err.strerror or err}"
                       f"{f' ({err.filename})' if err.filename else ''}; "
                       f"{_kept(checkpoint, 'complete')}") from None
    except TrainingDiverged as err:
        error = CLIError(f"{err}; stopped without saving — {_kept(checkpoint, 'good')}")
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
    saved = _where_saved(trainer, checkpoint, out)
    if status == "interrupted" and trainer.output_lost is not None:
        lost = trainer.output_lost
        error = CLIError(f"cannot write to standard output ({lost.strerror or lost}): "
                         f"stopped at step {trainer.step_count}; {saved}")
        if not isinstance(lost, BrokenPipeError):
            raise error
        print(error_line("train", error), file=sys.stderr, flush=True)
        return 128 + signal.SIGPIPE  # 141, what a shell reports for a command its reader left
    if status == "interrupted":
        with writing_stdout():
            print(f"interrupted at step {trainer.step_count}; {saved}", flush=True)
        signum = interrupted[0] if interrupted else trainer.stopped_by
        return 128 + signum  # 130 for SIGINT, 143 for SIGTERM, as a shell reports them
    val = trainer.history["val"][-1][1] if trainer.history["val"] else float("nan")
    with writing_stdout():
        print(f"done: {trainer.step_count} steps, validation loss {val:.4f}, "
              f"{trainer.elapsed:.1f} s of training; checkpoint in {checkpoint}, loss curve in "
              f"{out / 'loss.png'}", flush=True)
    return 0


# --- up-front checks ---------------------------------------------------------------------------


def check_arguments(args: argparse.Namespace) -> None:
    """Every flag's value, before anything is read or written (each error names the flag).
    Settings whose meaning is not obvious have a documented one: --grad-clip 0 turns
    clipping off, --checkpoint-interval 0 saves at each evaluation."""
    checks.output_dir(args.out, "--out")
    out = Path(args.out)
    for name, kind in (("checkpoint", "folder"), ("loss.png", "file"), ("tokens.bin", "file")):
        thing = out / name
        if thing.exists() and (thing.is_dir() != (kind == "folder") or thing.is_symlink()):
            raise CLIError(f"--out: {thing} exists and is not a {kind} this run can replace")
    if args.data is not None:
        checks.input_file(args.data, "--data")
    if args.tokenizer is not None:
        checks.input_file(args.tokenizer, "--tokenizer")
    for name in MODEL_FLAGS:
        value = getattr(args, name)
        if value is not None:
            checks.integer(value, f"--{name.replace('_', '-')}", low=1)
    for flag in ("steps", "batch_size", "grad_accum", "eval_interval", "eval_batches"):
        if getattr(args, flag) is not None:
            checks.integer(getattr(args, flag), f"--{flag.replace('_', '-')}", low=1)
    if args.steps is not None:  # a run that could never finish is a typo, not a request
        checks.fits_in_memory(HISTORY_BYTES_PER_STEP * args.steps,
                              f"--steps {args.steps}: the loss history (an entry a step, kept "
                              "in memory and in state.json)")
    if args.eval_batches is not None:  # like --steps: an evaluation that could never end
        checks.fits_in_memory(EVAL_BYTES_PER_BATCH * args.eval_batches,
                              f"--eval-batches {args.eval_batches}: the losses an evaluation "
                              "keeps (one a batch)")
    for flag in ("warmup", "checkpoint_interval"):
        if getattr(args, flag) is not None:
            checks.integer(getattr(args, flag), f"--{flag.replace('_', '-')}", low=0)
    if args.lr is not None:
        checks.finite(args.lr, "--lr", low=0, low_open=True)
    if args.min_lr is not None:
        checks.finite(args.min_lr, "--min-lr", low=0)
    if args.weight_decay is not None:
        checks.finite(args.weight_decay, "--weight-decay", low=0)
    if args.grad_clip is not None:
        checks.finite(args.grad_clip, "--grad-clip (0 turns clipping off)", low=0)
    checks.seed(args.seed)
    if args.train_tokenizer is not None:
        checks.integer(args.train_tokenizer, "--train-tokenizer", low=257)
    if args.device is not None:
        checks.device(args.device)
    if not args.resume:  # the model's size, before a byte of data is read
        from gptspec.spec.config import ConfigError

        try:
            config = _model_config(args)
        except ConfigError as err:
            raise CLIError(str(err)) from None
        _check_memory(config, args.batch_size or 1, args.grad_accum or 1)


def _check_model_flags_agree(args: argparse.Namespace, config: Any, checkpoint: Path) -> None:
    """On --resume the model is the checkpoint's: --preset and the model flags may only
    repeat it."""
    if args.preset is not None:
        from dataclasses import asdict

        from gptspec.spec.config import ConfigError, preset

        overrides = {k: getattr(args, k) for k in MODEL_FLAGS if getattr(args, k) is not None}
        try:
            described = asdict(preset(args.preset).replace(**overrides))
        except ConfigError as err:
            raise CLIError(str(err)) from None
        differ = [k for k, v in asdict(config).items() if described.get(k) != v]
        if differ:
            raise CLIError(f"--preset {args.preset} contradicts the checkpoint in {checkpoint} "
                           f"({differ[0]} = {described.get(differ[0])}, the checkpoint's "
                           f"{asdict(config)[differ[0]]}); --resume continues that model")
    for name in MODEL_FLAGS:
        given = getattr(args, name)
        if given is not None and given != getattr(config, name):
            raise CLIError(f"--{name.replace('_', '-')} {given} contradicts the checkpoint in "
                           f"{checkpoint} ({name} = {getattr(config, name)}); --resume "
                           "continues that model")


def _check_memory(config: Any, batch_size: int, grad_accum: int = 1) -> None:
    """Parameters, gradients and AdamW's two moments in float32, one micro-batch's
    activations (spec/costs.py), and the step's micro-batches of int64 inputs and targets,
    before allocating them."""
    from gptspec.reference.costs import activation_memory_bytes, param_count_total

    need = (16 * param_count_total(config)
            + activation_memory_bytes(config, batch=batch_size, seq_len=config.n_ctx,
                                      bytes_per_element=4)
            + 16 * batch_size * config.n_ctx * grad_accum)
    checks.fits_in_memory(need, f"the model (weights, gradients and AdamW moments in "
                          f"float32) with {grad_accum} micro-batch(es) of {batch_size}")


def _model_config(args: argparse.Namespace) -> Any:
    """The model the flags describe (before a tokenizer can change nothing but checks)."""
    from gptspec.spec.config import preset

    overrides = {k: getattr(args, k) for k in MODEL_FLAGS if getattr(args, k) is not None}
    return preset(DEFAULT_PRESET if args.preset is None else args.preset).replace(**overrides)


def _stored_path(out: Path, file: Path) -> str:
    """A token file's path as state.json keeps it: relative to the run directory when it
    lies inside it (so the directory can be moved), else absolute."""
    full = Path(file).resolve()
    try:
        return full.relative_to(Path(out).resolve()).as_posix()
    except ValueError:
        return str(full)


def _tokens_path(out: Path, stored: str) -> Path:
    """Where a stored token path is now: relative ones are inside the run directory; an
    absolute one inside a run directory since moved is looked for in the new one."""
    path = Path(stored)
    if not path.is_absolute():
        return out / path
    if not path.exists() and (out / path.name).is_file():
        return out / path.name
    return path
