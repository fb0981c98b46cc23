"""The conformance checks, registered by id, with the spec entries they cover.

A check is a function ``fn(backend, ctx)`` that raises on failure; ``ctx`` (a
:class:`gptspec.conformance.context.CheckContext`) runs its Hypothesis properties and
records every comparison's fraction of budget. A check declares ``entries`` (the spec
entries it covers), ``ops`` (the optional backend operations it calls: without one, not
implemented), ``depends_on`` (the checks of the operations it is built from: when one
fails, this one is blocked by it rather than failing in cascade) and ``kind``
("differential", against the reference, or "property").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gptspec.conformance.protocol import needed_capabilities

CheckFn = Callable[[Any, Any], None]


@dataclass(frozen=True)
class Check:
    id: str
    entries: tuple[str, ...]
    ops: tuple[str, ...]
    depends_on: tuple[str, ...]
    kind: str
    fn: CheckFn
    area: str  # "forward", "tokenizer", "training", "generation": which suite it belongs to
    budget: str  # how its tolerance is derived, in words (for the report and the docs)

    @property
    def needs(self) -> tuple[str, ...]:
        """The areas (protocol.CAPABILITIES) a backend must declare for this check to run:
        those of its operations, the model's where it calls only ``forward``."""
        return needed_capabilities(self.ops)

    @property
    def doc(self) -> str:
        return (self.fn.__doc__ or "").strip()

    @property
    def summary(self) -> str:
        return self.doc.splitlines()[0] if self.doc else self.id


CHECKS: dict[str, Check] = {}


def check(id: str, *, entries: str | tuple[str, ...], ops: tuple[str, ...] = (),
          depends_on: tuple[str, ...] = (), kind: str = "differential", area: str = "forward",
          budget: str = "") -> Callable[[CheckFn], CheckFn]:
    """Register a check. Its docstring is its documentation: first line a summary, then
    the property stated precisely, with its preconditions."""
    if kind not in ("differential", "property"):
        raise ValueError(f"check {id!r}: unknown kind {kind!r}")

    def register(fn: CheckFn) -> CheckFn:
        if id in CHECKS:
            raise ValueError(f"duplicate check id {id!r}")
        CHECKS[id] = Check(id, (entries,) if isinstance(entries, str) else tuple(entries),
                           tuple(ops), tuple(depends_on), kind, fn, area, budget)
        return fn

    return register


def checks_for(entry_id: str) -> list[Check]:
    """The checks that cover a spec entry."""
    _load_all()
    return [c for c in CHECKS.values() if entry_id in c.entries]


def all_checks(area: str | None = None) -> list[Check]:
    """Every registered check, dependencies before dependents."""
    _load_all()
    ordered: list[Check] = []
    seen: set[str] = set()

    def visit(c: Check) -> None:
        if c.id in seen:
            return
        seen.add(c.id)
        for dep in c.depends_on:
            if dep not in CHECKS:
                raise KeyError(f"check {c.id!r} depends on unknown check {dep!r}")
            visit(CHECKS[dep])
        ordered.append(c)

    for c in list(CHECKS.values()):
        visit(c)
    return [c for c in ordered if area is None or c.area == area]


CHECK_MODULES = (
    "gptspec.conformance.checks_embedding",
    "gptspec.conformance.checks_attention",
    "gptspec.conformance.checks_block",
    "gptspec.conformance.checks_output",
    "gptspec.conformance.checks_probes",
    "gptspec.conformance.checks_tokenizer",
    "gptspec.conformance.checks_loss",
    "gptspec.conformance.checks_gradients",
    "gptspec.conformance.checks_optimizer",
    "gptspec.conformance.checks_sampling",
    "gptspec.conformance.checks_costs",
)


def _load_all() -> None:
    import importlib
    import importlib.util

    for name in CHECK_MODULES:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
