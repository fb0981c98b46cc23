"""The conformance checks that cover a spec entry, from the conformance registry.

Checks are declared once, in ``conformance/checks_<area>.py``, each naming the entry it
covers; ``gptspec.conformance.registry.checks_for(entry_id)`` finds them. This module
only turns them into what a page shows: an id and a budget description.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CheckInfo:
    id: str
    budget: str  # how the check's tolerance is derived, in words or LaTeX
    description: str = ""
    ops: tuple[str, ...] = ()  # the backend operations it calls


def is_direct(entry_id: str, check: Any) -> bool:
    """Whether a check exercises an entry on its own: it calls the backend's operation of
    that name (for ``gpt_forward``, the model's forward pass, which a check naming no
    operation calls), or it is the entry's own check (its id begins ``<entry>.``).
    Otherwise the entry reaches the check only inside a larger computation."""
    return (entry_id in check.ops or check.id.split(".")[0] == entry_id
            or (not check.ops and entry_id == "gpt_forward"))


def _text(value: Any) -> str:
    if value is None:
        return ""
    if callable(value):
        value = value()
    return str(value)


def _info(check: Any) -> CheckInfo:
    budget = ""
    for name in ("budget_description", "budget", "tolerance"):
        budget = _text(getattr(check, name, None))
        if budget:
            break
    description = ""
    for name in ("summary", "description", "doc"):
        description = _text(getattr(check, name, None)).strip()
        if description:
            break
    return CheckInfo(id=str(check.id), budget=budget, description=description.split("\n")[0],
                     ops=tuple(getattr(check, "ops", ())))


def load_checks_for() -> tuple[Callable[[str], list[CheckInfo]], str]:
    """(lookup, problem): ``problem`` is empty when the conformance registry was found,
    else why every entry's checks are missing (shown in the traceability matrix)."""
    try:
        registry = importlib.import_module("gptspec.conformance.registry")
    except ImportError as err:
        return (lambda entry_id: []), f"the conformance registry cannot be imported ({err})"
    checks_for = getattr(registry, "checks_for", None)
    if checks_for is None:
        return (lambda entry_id: []), "gptspec.conformance.registry has no checks_for()"

    def lookup(entry_id: str) -> list[CheckInfo]:
        return [_info(c) for c in checks_for(entry_id)]

    return lookup, ""
