"""``gptspec experiment NAME``: answer one of the Notes' open questions with a controlled
study, or all three.

    gptspec experiment all                  # the full studies (hours of CPU time)
    gptspec experiment vocab --seeds 5      # more seeds: the 3 finished ones are kept
    gptspec experiment all --quick          # tiny models, a few steps, one seed (CI)
    gptspec experiment tying --plan         # the arms, their steps, sizes and FLOPs

Runs are processes, ``--jobs`` at a time; finished runs are kept in OUT/.runs/, so a
rerun continues a study. Each study replaces only its own OUT/<study>.json and figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import signal
import sys
from pathlib import Path

from gptspec.cli import (
    CLIError,
    HungUp,
    Terminated,
    arguments,
    printable,
    standard_stream,
    writing_stdout,
)

NAMES = ("vocab", "tying", "head-width", "all")
FULL_OUT = Path("docs") / "experiments"  # the results the site answers from
QUICK_OUT = Path("out") / "experiments"
MAX_SEEDS = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=NAMES, metavar="NAME",
                        help="the study: vocab, tying, head-width, or all")
    parser.add_argument("--quick", action="store_true",
                        help="tiny models, a few steps, one seed: proves the harness, answers "
                             "nothing (default --out out/experiments)")
    parser.add_argument("--data", type=arguments.file_argument, default=None,
                        help="UTF-8 text to train and validate on (default: the .py files of "
                             "Python's standard library, as gptspec train)")
    parser.add_argument("--out", type=arguments.path_argument, default=None,
                        help=f"results folder (default: {FULL_OUT}, with --quick {QUICK_OUT})")
    parser.add_argument("--jobs", type=int, default=None,
                        help=f"runs at once, one thread each (default: the cores, "
                             f"{arguments.cores()})")
    parser.add_argument("--seeds", type=int, default=None,
                        help="seeds per arm (default 3, with --quick 1); more seeds keep the "
                             "runs of the first ones")
    parser.add_argument("--plan", action="store_true",
                        help="print the arms, their steps, sizes and FLOPs, and stop")


def _check(args: argparse.Namespace) -> None:
    if args.jobs is not None:
        arguments.jobs(args.jobs)
    if args.seeds is not None and not 1 <= args.seeds <= MAX_SEEDS:
        # the real bound, whatever the number's size (arguments.integer said "below 2^63"
        # for a number above that, where the limit is MAX_SEEDS)
        raise CLIError(f"--seeds must be in [1, {MAX_SEEDS}], got {args.seeds}")
    if args.data is not None:  # under --plan too: the plan is of this command
        from gptspec.fast.data import TOKEN_FILE_SUFFIXES

        arguments.input_file(args.data, "--data", pipe=True)  # <(command): read once
        if args.data.suffix in TOKEN_FILE_SUFFIXES:
            raise CLIError(f"--data: {args.data} looks like token ids; the studies need text "
                           "(the vocabulary study trains its tokenizers on it)")
    out = args.out if args.out is not None else (QUICK_OUT if args.quick else FULL_OUT)
    arguments.output_dir(out, "--out")
    if args.quick and out.resolve() == FULL_OUT.resolve():
        raise CLIError(f"--out {out}: quick results answer nothing and are not written where "
                       "the site reads its answers; choose another folder")
    if args.plan:
        return
    if importlib.util.find_spec("matplotlib") is None:
        raise CLIError("the studies draw their figures with matplotlib, which is not "
                       "installed: pip install 'gptspec[experiments]'")


def _studies(args: argparse.Namespace):
    from gptspec.experiments.studies import FULL, QUICK, STUDY_NAMES, design

    scale = QUICK if args.quick else FULL
    names = STUDY_NAMES if args.name == "all" else (args.name,)
    return [design(n, scale) for n in names]


def _print_plan(studies, seeds: int) -> None:
    from gptspec.experiments.studies import non_embedding_params
    from gptspec.reference.costs import param_count_total, training_flops_per_token

    total = 0
    for s in studies:
        print(f"{s.name} ({s.scale.name}): {s.title}; matched: {s.matched}; "
              f"{len(s.arms)} arms × {seeds} seeds")
        for a in s.arms:
            c = a.config
            flops = a.steps * s.scale.tokens_per_step * training_flops_per_token(c)
            total += flops * seeds
            print(f"  {a.name:<14} V {c.vocab_size:>5}  d {c.d_model:>4}  L {c.n_layers}  "
                  f"h {c.n_heads:>2}  d_H {c.d_head:>3}  {'tied' if c.tied_embeddings else 'untied'}"
                  f"  params {param_count_total(c):>9,} (non-embedding {non_embedding_params(c):,})"
                  f"  steps {a.steps:>5}  {_flop_text(flops)}")
    print(f"in all: {_flop_text(total)} of training")


def _flop_text(flops: float) -> str:
    """3 significant digits in the largest unit that keeps the number ≥ 1 (a quick plan's
    total printed as "0.0 TFLOP" said there was no training at all)."""
    for unit, size in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if flops >= size:
            return f"{flops / size:.3g} {unit}"
    return f"{flops:.3g} FLOP"


def _corpus(args: argparse.Namespace, scale):
    from gptspec.cli.train import read_text, stdlib_text
    from gptspec.experiments.corpus import split_text

    text, source = (read_text(args.data), str(args.data)) if args.data else stdlib_text()
    if scale.max_chars is not None and len(text) > scale.max_chars:
        text, source = text[: scale.max_chars], f"the first {scale.max_chars:,} characters of {source}"
    if not text.strip():
        raise CLIError(f"--data: {source} holds no text")
    return split_text(text, source, scale.val_fraction)


def _check_outputs(data: Path | None, out: Path, names: list[str]) -> None:
    """Before the corpus is read: no file the studies write is the --data file, which is
    not in their working folders either, and each such file in OUT that exists is the
    study's own (runner.check_outputs); a user's file of the same name is refused."""
    from gptspec.experiments.runner import ExperimentError, check_outputs, study_outputs

    for name in names:
        for path in study_outputs(name, out):
            arguments.not_an_input(path, "--out", {"--data": data})
    if data is not None and data.exists():
        real = data.resolve()
        for working in (out / ".runs", out / ".cache"):
            if real.is_relative_to(working.resolve()):
                raise CLIError(f"--data {data} is inside {working}, the studies' working "
                               "files, which they replace; choose another --data or --out")
    try:
        check_outputs(names, out)
    except ExperimentError as err:
        raise CLIError(str(err)) from None


def run(args: argparse.Namespace) -> int:
    _check(args)
    from gptspec.experiments.studies import SEEDS

    seeds = args.seeds if args.seeds is not None else (1 if args.quick else SEEDS)
    studies = _studies(args)
    if args.plan:
        # the data the run would refuse, refused here with its line (as far as the bytes
        # tell: experiments.corpus.corpus_problem); the plan trains no tokenizer
        from gptspec.experiments.corpus import corpus_problem

        problem = corpus_problem(studies, _corpus(args, studies[0].scale))
        if problem is not None:
            raise CLIError(problem)
        standard_stream("stdout", "--plan prints the plan there")
        with writing_stdout():
            _print_plan(studies, seeds)
        return 0
    from gptspec.experiments.runner import ExperimentError, run_studies
    from gptspec.fast.run_lock import missing_folders

    out = args.out if args.out is not None else (QUICK_OUT if args.quick else FULL_OUT)
    jobs = args.jobs if args.jobs is not None else arguments.cores()
    _check_outputs(args.data, out, [s.name for s in studies])
    corpus = _corpus(args, studies[0].scale)
    command = {"name": args.name, "quick": args.quick, "seeds": seeds,
               "data": str(args.data) if args.data else None}
    # one writer per --out folder: a second study there would write the same run files at
    # once, or take the first's live runs for stale ones
    lock = arguments.take_run_lock(out, out, "--out", named=True, made=missing_folders(out))
    try:
        return run_studies(studies, corpus, out, jobs, seeds, command,
                           # a corpus or --out name's escape sequences spelled out
                           log=lambda line: print(printable(line), flush=True))
    except ExperimentError as err:
        raise CLIError(str(err)) from None
    except KeyboardInterrupt as stop:
        return _stopped(stop, out)
    finally:
        lock.release(remove=True)


def _stopped(stop: KeyboardInterrupt, out: Path) -> int:
    """The line (on standard error, as the CLI's other stops) and exit status of a study
    stopped by a signal, as a shell reports it and train does: 130 for Ctrl-C, 143 for
    SIGTERM, 129 for SIGHUP (SIGTERM and SIGHUP were said and exited as Ctrl-C)."""
    signum = (signal.SIGHUP if isinstance(stop, HungUp) else signal.SIGTERM
              if isinstance(stop, Terminated) else getattr(stop, "signum", signal.SIGINT))
    said = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated",
            signal.SIGHUP: "hung up (SIGHUP)"}.get(signum, f"stopped by signal {signum}")
    print(f"gptspec experiment: {said}: the finished runs are kept in "
          f"{printable(str(out / '.runs'))}; the same command continues the study",
          file=sys.stderr, flush=True)
    return 128 + signum

