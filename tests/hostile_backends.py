"""Backends that misbehave the way a careless or hostile one would, for the bad-input
corpus (tests/test_bad_input.py) and the process tests (tests/test_cli_process.py):
``gptspec conformance --backend hostile_backends:NAME`` must answer each in one line."""

from __future__ import annotations

import sys
import time

from gptspec.reference.forward import gpt_forward


class Honest:
    """A correct backend: the reference itself, under the protocol's attributes."""

    protocol_version = 2
    name = "hostile"
    version = "0"
    device = "cpu"
    dtype = "float64"

    def forward(self, tokens, params, config):
        return gpt_forward(tokens, params, config)


class ExitsOnStart(Honest):
    """sys.exit(0) while being built: in the suite's own process this once ended the run
    with status 0, as if every check had passed."""

    def __init__(self) -> None:
        sys.exit(0)


class InterruptsOnStart(Honest):
    def __init__(self) -> None:
        raise KeyboardInterrupt


class FailsInTwoLines(Honest):
    def __init__(self) -> None:
        raise RuntimeError("first line\nsecond line")


class NameRaises(Honest):
    @property
    def name(self) -> str:  # type: ignore[override]
        raise RuntimeError("no name today")


class UnknownDtype(Honest):
    dtype = "int7"


class Hangs(Honest):
    def forward(self, tokens, params, config):
        time.sleep(3600)
