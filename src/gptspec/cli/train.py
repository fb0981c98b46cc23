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
from typing import TYPE_CHECKING, Any

from gptspec.cli import CLIError, arguments, error_line, printable, writing_stdout

if TYPE_CHECKING:  # imported when run: `gptspec train --help` does not pay for torch
    from gptspec.fast.train import TrainSettings
    from gptspec.fast.training_run import TrainingRun, Vet
    from gptspec.spec.config import GPTConfig

MODEL_FLAGS: dict[str, type] = {"vocab_size": int, "n_ctx": int, "d_model": int, "n_layers": int,
               "n_heads": int, "d_head": int, "d_ff": int}
HISTORY_BYTES_PER_STEP = 136  # [step, loss] as Python keeps it (measured with tracemalloc)
EVAL_BYTES_PER_BATCH = 32  # a float and its list slot: an evaluation keeps each batch's loss
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
    parser.add_argument("--data", type=arguments.file_argument, default=None,
                        help="UTF-8 text, or token ids (.bin raw uint16/uint32, .npy); default: "
                             "the .py files of Python's standard library")
    parser.add_argument("--tokenizer", type=arguments.file_argument, default=None,
                        help="tokenizer file to load (default: byte level, 256 tokens)")
    parser.add_argument("--train-tokenizer", type=int, default=None, metavar="VOCAB",
                        help="train a BPE tokenizer of this vocabulary size on the text first")
    parser.add_argument("--out", type=arguments.path_argument, default=Path("out"), help="output directory")
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
    arguments.input_file(path, "--data", pipe=True)
    try:
        return arguments.read_input(path, "--data").decode("utf-8")
    except UnicodeDecodeError as err:
        raise CLIError(f"data file {str(path)!r} is not valid UTF-8 (byte {err.start})") from None


def run(args: argparse.Namespace) -> int:
    from gptspec.fast.training_run import RunError

    try:
        with _open(args) as training:  # OUT's lock is held until the run ends
            return _train(args, training)
    except RunError as err:
        raise CLIError(str(err)) from None


def _open(args: argparse.Namespace) -> TrainingRun:
    """The TrainingRun the flags ask for, fresh or resumed."""
    from gptspec.fast.training_run import Corpus, TrainingRun

    check_arguments(args)
    changes = {field: getattr(args, flag) for flag, (field, _) in TRAIN_FLAGS.items()
               if getattr(args, flag) is not None}
    if getattr(args, "compile", None):  # on --resume, without the flag, as the run was
        changes["compile"] = True
    if args.resume:
        if args.data is not None or args.tokenizer is not None or args.train_tokenizer:
            raise CLIError("--resume reads the data and tokenizer of the checkpointed run; "
                           "do not pass --data or a tokenizer")
        model = {k: getattr(args, k) for k in MODEL_FLAGS if getattr(args, k) is not None}
        return TrainingRun.resume(args.out, changes, model, args.preset, _vet(args))
    data = args.data
    corpus = Corpus(data, lambda: (read_text(data), str(data)) if data is not None
                    else stdlib_text(), args.tokenizer, args.train_tokenizer)
    return TrainingRun.fresh(args.out, _model_config(args), changes, corpus, _vet(args))


def _vet(args: argparse.Namespace) -> Vet:
    """The run's settings (the flags', or the checkpoint's with them) against this machine,
    each refusal naming where the value came from."""
    state = args.out / "checkpoint" / "state.json"
    where = f"{state}: " if args.resume else ""

    def vet(config: GPTConfig, settings: TrainSettings) -> None:
        # the flag is checked up front; a state.json's value here (an evaluation never ending)
        arguments.fits_in_memory(EVAL_BYTES_PER_BATCH * settings.eval_batches,
                              f"{where}eval_batches {settings.eval_batches}: the losses an "
                              "evaluation keeps (one a batch)")
        if not args.resume:
            arguments.device(settings.device)
        _check_memory(config, settings.batch_size, settings.grad_accum)
        if args.resume:
            arguments.device(settings.device, "--device" if args.device else
                          f"the checkpoint's device ({state})")
    return vet


def _train(args: argparse.Namespace, training: TrainingRun) -> int:
    from gptspec.fast.training_run import RunDiverged

    trainer, config, world = training.trainer, training.config, training.world
    if training.rank == 0:
        source = printable(training.source)  # a file name may hold escape sequences
        with writing_stdout():
            print(f"training {config.n_layers} layers × d_model {config.d_model} "
                  f"({sum(p.numel() for p in trainer.model.parameters()):,} parameters) on "
                  f"{len(training.tokens):,} tokens of {source}; {trainer.tokens_per_step:,} "
                  f"tokens per step{f' on {world} processes' if world > 1 else ''}, device "
                  f"{training.settings.device}", flush=True)
        settings = training.settings
        schedule = settings.decay_steps or settings.max_steps
        if args.warmup is not None and settings.warmup_steps > schedule:
            # TrainSettings.learning_rate shortens it (the default's, quietly)
            print(f"gptspec train: warning: a warm-up of {settings.warmup_steps} steps does "
                  f"not fit the schedule's {schedule}: the learning rate warms up over "
                  f"{schedule} step{'s' if schedule > 1 else ''} instead", file=sys.stderr,
                  flush=True)
    try:
        status = training.train(progress=not args.no_progress and sys.stderr is not None)
    except RunDiverged as err:
        if world == 1:
            raise
        # Every process stopped at the same step (Trainer._stop_unless_finite). Rank 0 says
        # so once; the others exit only after it has, because torchrun ends the whole group
        # as soon as one process fails, which could cut rank 0 off before its line.
        if training.rank == 0:
            print(error_line("train", str(err)), file=sys.stderr, flush=True)
        training.wait_for_the_others()
        return 2
    if training.rank != 0:
        return 0
    if status == "interrupted":
        saved = training.where_saved()
        lost = trainer.output_lost
        if lost is not None:
            error = CLIError(f"cannot write to standard output ({lost.strerror or lost}): "
                             f"stopped at step {trainer.step_count}; {saved}")
            if not isinstance(lost, BrokenPipeError):
                raise error
            print(error_line("train", error), file=sys.stderr, flush=True)
            return 128 + signal.SIGPIPE  # 141, what a shell reports when its reader left
        with writing_stdout():
            print(f"interrupted at step {trainer.step_count}; {printable(saved)}", flush=True)
        return 128 + training.stopped_by  # 130 for SIGINT, 143 for SIGTERM, as a shell does
    val = trainer.history["val"][-1][1] if trainer.history["val"] else float("nan")
    with writing_stdout():
        print(f"done: {trainer.step_count} steps, validation loss {val:.4f}, "
              f"{trainer.elapsed:.1f} s of training; checkpoint in "
              f"{printable(training.checkpoint)}, loss curve in "
              f"{printable(args.out / 'loss.png')}", flush=True)
    return 0


# --- up-front checks ---------------------------------------------------------------------------


def check_arguments(args: argparse.Namespace) -> None:
    """Every flag's value, before anything is read or written (each error names the flag).
    Settings whose meaning is not obvious have a documented one: --grad-clip 0 turns
    clipping off, --checkpoint-interval 0 saves at each evaluation."""
    arguments.output_dir(args.out, "--out")
    out = Path(args.out)
    for name, kind in (("checkpoint", "folder"), ("loss.png", "file"), ("tokens.bin", "file")):
        thing = out / name
        if thing.exists() and (thing.is_dir() != (kind == "folder") or thing.is_symlink()):
            raise CLIError(f"--out: {thing} exists and is not a {kind} this run can replace")
    if args.data is not None:
        from gptspec.fast.data import TOKEN_FILE_SUFFIXES

        text = Path(args.data).suffix not in TOKEN_FILE_SUFFIXES
        arguments.input_file(args.data, "--data", pipe=text)  # text is read once: a pipe will do
        # what the run writes in OUT: tokens.bin only for a text corpus
        written = ("loss.png", "checkpoint") + (("tokens.bin",) if text else ())
        for name in written:
            target = out / name
            data = Path(os.path.realpath(args.data))
            if data == Path(os.path.realpath(target)) or data.is_relative_to(
                    os.path.realpath(target)):
                raise CLIError(f"--data {args.data}: the run writes its {name} there; keep "
                               "the data outside --out's files")
    if args.tokenizer is not None:
        arguments.input_file(args.tokenizer, "--tokenizer")
    for name in MODEL_FLAGS:
        value = getattr(args, name)
        if value is not None:
            arguments.integer(value, f"--{name.replace('_', '-')}", low=1)
    for flag in ("steps", "batch_size", "grad_accum", "eval_interval", "eval_batches"):
        if getattr(args, flag) is not None:
            arguments.integer(getattr(args, flag), f"--{flag.replace('_', '-')}", low=1)
    if args.steps is not None:  # a run that could never finish is a typo, not a request
        arguments.fits_in_memory(HISTORY_BYTES_PER_STEP * args.steps,
                              f"--steps {args.steps}: the loss history (an entry a step, kept "
                              "in memory and in state.json)")
    if args.eval_batches is not None:  # like --steps: an evaluation that could never end
        arguments.fits_in_memory(EVAL_BYTES_PER_BATCH * args.eval_batches,
                              f"--eval-batches {args.eval_batches}: the losses an evaluation "
                              "keeps (one a batch)")
    for flag in ("warmup", "checkpoint_interval"):
        if getattr(args, flag) is not None:
            arguments.integer(getattr(args, flag), f"--{flag.replace('_', '-')}", low=0)
    if args.lr is not None:
        arguments.finite(args.lr, "--lr", low=0, low_open=True)
    if args.min_lr is not None:
        arguments.finite(args.min_lr, "--min-lr", low=0)
    if args.weight_decay is not None:
        arguments.finite(args.weight_decay, "--weight-decay", low=0)
    if args.grad_clip is not None:
        arguments.finite(args.grad_clip, "--grad-clip (0 turns clipping off)", low=0)
    arguments.seed(args.seed)
    if args.train_tokenizer is not None:
        arguments.integer(args.train_tokenizer, "--train-tokenizer", low=257)
    if args.device is not None:
        arguments.device(args.device)
    if (args.precision in ("bfloat16", "float16")
            and (args.device or ("" if args.resume else "cpu")).partition(":")[0] == "cpu"):
        raise CLIError(f"--precision {args.precision} is mixed precision on CUDA (--device "
                       f"cuda); on the CPU training runs in float32: leave --precision out "
                       f"or give float32")
    if not args.resume:  # the model's size, before a byte of data is read
        from gptspec.spec.config import ConfigError

        try:
            config = _model_config(args)
        except ConfigError as err:
            raise CLIError(str(err)) from None
        _check_memory(config, args.batch_size or 1, args.grad_accum or 1)


def _check_memory(config: Any, batch_size: int, grad_accum: int = 1) -> None:
    """Parameters, gradients and AdamW's two moments in float32, one micro-batch's
    activations (spec/costs.py), and the step's micro-batches of int64 inputs and targets,
    before allocating them."""
    from gptspec.reference.costs import activation_memory_bytes, param_count_total

    need = (16 * param_count_total(config)
            + activation_memory_bytes(config, batch=batch_size, seq_len=config.n_ctx,
                                      bytes_per_element=4)
            + 16 * batch_size * config.n_ctx * grad_accum)
    arguments.fits_in_memory(need, f"the model (weights, gradients and AdamW moments in "
                          f"float32) with {grad_accum} micro-batch(es) of {batch_size}")


def _model_config(args: argparse.Namespace) -> Any:
    """The model the flags describe (before a tokenizer can change nothing but checks)."""
    from gptspec.spec.config import preset

    overrides = {k: getattr(args, k) for k in MODEL_FLAGS if getattr(args, k) is not None}
    return preset(DEFAULT_PRESET if args.preset is None else args.preset).replace(**overrides)
