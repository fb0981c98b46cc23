"""The ``gptspec`` command: one subcommand per module of this package.

Each subcommand module defines ``add_arguments(parser)`` and ``run(args) -> int``;
they are imported only when chosen, so ``gptspec info`` does not pay for torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = {
    "conformance": "validate a backend against the float64 reference",
    "tokenizer": "train, encode and decode with a byte-level BPE tokenizer",
    "train": "train a model",
    "generate": "generate text from a checkpoint",
    "info": "sizes and costs of a preset",
    "convert": "convert checkpoints to and from the transformers layout",
}


class CLIError(Exception):
    """A user-facing error: printed as one line, exit status 2."""


def error_line(command: str, err: CLIError) -> str:
    """The one line a CLIError is reported as."""
    return f"gptspec {command}: error: {err}"


def build_parser(which: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gptspec", description=__doc__.splitlines()[0])
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
