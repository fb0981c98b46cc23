"""The shape of a spec entry, and the registry that holds them.

An entry is data plus executable meaning. Its meaning is ``sympy``: a Python function
written with sympy that computes the equation's output from sympy matrices (or
scalars). That source is the truth; ``latex`` is how it is displayed, never parsed.
The reference function named by ``reference`` transcribes it in float64 NumPy, and
the conformance checks (each names the entry it covers, see
gptspec.conformance.registry) test backends against that reference.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gptspec.spec.sources import Source

GROUPS = (
    "tokenizer",
    "embedding",
    "attention",
    "block",
    "output",
    "loss",
    "gradients",
    "optimizer",
    "sampling",
    "costs",
)


@dataclass(frozen=True)
class Symbol:
    """A named quantity of an equation, with its shape in the configuration's sizes."""

    name: str  # as written in the LaTeX, e.g. r"W_Q"
    shape: str  # e.g. "(d_model, d_k)"; "()" for a scalar
    meaning: str


@dataclass(frozen=True)
class Reading:
    """One document's reading of an equation, where the documents disagree."""

    source: Source
    reading: str  # what that document writes, in words or LaTeX


@dataclass(frozen=True)
class Decision:
    """Where the documents disagree: every reading, and what the project decided."""

    question: str
    readings: tuple[Reading, ...]
    decision: str
    why: str


@dataclass(frozen=True)
class Tolerance:
    """How far a backend's result may lie from the float64 reference.

    ``formula`` is LaTeX for the documentation; ``reduction`` names the length of
    the longest inner sum (the n of the error bound) in the configuration's sizes.
    The numbers are computed in :mod:`gptspec.conformance.budgets`.
    """

    formula: str
    reduction: str
    note: str = ""


@dataclass(frozen=True)
class Equation:
    id: str
    title: str
    group: str
    latex: str
    symbols: tuple[Symbol, ...]
    sources: tuple[Source, ...]
    sympy: Callable[..., Any]
    reference: str  # name of the function in gptspec.reference
    tolerance: Tolerance | None = None
    decisions: tuple[Decision, ...] = ()
    notes: str = ""
    sympy_inputs: tuple[tuple[str, str], ...] = field(default=())
    """(argument name, shape) of ``sympy``'s arguments, sizes as expressions of the
    configuration's sizes (the notation is described in gptspec.spec.embedding's module
    docstring). The tests substitute small sizes and evaluate it on random inputs."""

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"equation {self.id!r}: unknown group {self.group!r}")
        if not self.sources:
            raise ValueError(f"equation {self.id!r}: no sources")

    @property
    def sympy_source(self) -> str:
        """The sympy definition, as written: this text is the equation's meaning."""
        return inspect.getsource(self.sympy)


class Registry:
    """All entries, in reading order: the order of the modules that declare them
    (``declare_on_first_use``), and within a module the order of declaration.

    The entry modules build sympy expressions, and importing sympy takes half a second;
    so they are imported when the registry is first read, not when ``gptspec.spec`` is
    (a training run reads GPTConfig and the parameter schema, never an entry)."""

    def __init__(self) -> None:
        self._entries: dict[str, Equation] = {}
        self._undeclared: tuple[str, ...] = ()  # modules still to import, in reading order

    def declare_on_first_use(self, modules: tuple[str, ...]) -> None:
        """Import ``modules`` (which declare the entries, in this order) when the registry
        is first read."""
        self._undeclared = modules

    def _all(self) -> dict[str, Equation]:
        if self._undeclared:
            modules, self._undeclared = self._undeclared, ()
            for module in modules:
                importlib.import_module(module)
            # a module imported directly before the first read declared its entries
            # early: reading order is the modules' order
            rank = {module: i for i, module in enumerate(modules)}
            ordered = sorted(self._entries.values(),
                             key=lambda e: rank.get(e.sympy.__module__, len(rank)))
            self._entries = {e.id: e for e in ordered}
        return self._entries

    def add(self, entry: Equation) -> Equation:
        if entry.id in self._entries:
            raise ValueError(f"duplicate spec entry id {entry.id!r}")
        self._entries[entry.id] = entry
        return entry

    def __getitem__(self, entry_id: str) -> Equation:
        try:
            return self._all()[entry_id]
        except KeyError:
            raise KeyError(f"no spec entry {entry_id!r}") from None

    def __iter__(self):
        return iter(self._all().values())

    def __len__(self) -> int:
        return len(self._all())

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._all()

    def by_group(self, group: str) -> list[Equation]:
        return [e for e in self if e.group == group]


REGISTRY = Registry()


def equation(**fields: Any) -> Callable[[Callable[..., Any]], Equation]:
    """Declare a spec entry whose meaning is the decorated sympy function.

    Usage::

        @equation(id="softmax", title="Softmax", group="attention", ...)
        def softmax(z):
            ...  # sympy
    """

    def declare(sympy_form: Callable[..., Any]) -> Equation:
        return REGISTRY.add(Equation(sympy=sympy_form, **fields))

    return declare
