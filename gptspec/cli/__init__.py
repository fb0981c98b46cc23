"""The ``gptspec`` command: one subcommand per module of this package.

Each subcommand module defines ``add_arguments(parser)`` and ``run(args) -> int``;
they are imported only when chosen, so ``gptspec info`` does not pay for torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

SUBCOMMANDS = {
    "conformance": "validate a backend against the float64 reference",
    "tokenizer": "train, encode and decode with a byte-level BPE tokenizer",
    "train": "train a model",
    "generate": "generate text from a checkpoint",
    "info": "sizes and costs of a preset",
    "convert": "convert checkpoints to and from the transformers layout",
    "experiment": "answer the Notes' open questions with controlled studies",
}


class CLIError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def error_line(command: str, err: CLIError) -> str:
    """The one line a CLIError is reported as."""
    return f"gptspec {command}: error: {err}"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is reported in one line (the usage is one --help away)."""

    def error(self, message: str):  # type: ignore[override]
        first = message.strip().splitlines()[0] if message.strip() else "bad arguments"
        self.exit(2, f"{self.prog}: error: {first} (see {self.prog} --help)\n")


def build_parser(which: str | None = None) -> argparse.ArgumentParser:
    parser = OneLineParser(prog="gptspec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == which:  # only the chosen subcommand's module is imported
            importlib.import_module(f"gptspec.cli.{name}").add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    which = next((a for a in argv if a in SUBCOMMANDS), None)
    args = build_parser(which).parse_args(argv)
    module = importlib.import_module(f"gptspec.cli.{args.command}")
    try:
        return int(module.run(args) or 0)
    except CLIError as err:
        print(error_line(args.command, err), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"gptspec {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (``gptspec generate … | head -c 2``): stop quietly, and keep
        # Python from complaining again when it flushes stdout at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by it
    except (OSError, MemoryError, RecursionError, Exception) as err:
        # failures that only show up during the work (disk full, permission lost, out of
        # memory): one line, and with GPTSPEC_TRACEBACK=1 the traceback for a bug report
        if os.environ.get("GPTSPEC_TRACEBACK"):
            raise
        if isinstance(err, ModuleNotFoundError) and (err.name or "").partition(".")[0] == "torch":
            # torch is an extra: the conformance suite runs without it, training and
            # generation do not
            print(error_line(args.command, CLIError(
                "this needs PyTorch, which is not installed: pip install 'gptspec[torch]'")),
                file=sys.stderr)
            return 2
        print(f"gptspec {args.command}: error: {_describe(err)}", file=sys.stderr)
        return 1


def _describe(err: BaseException) -> str:
    """One line for an unexpected failure: the OS's words and file for an OSError."""
    if isinstance(err, MemoryError):
        return "out of memory"
    if isinstance(err, OSError) and err.strerror:
        where = f": {err.filename}" if err.filename else ""
        return f"{err.strerror}{where}"
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''} (GPTSPEC_TRACEBACK=1 shows where)"
