"""The conformance checks that cover a spec entry, from the conformance registry.

Checks are declared once, in ``conformance/checks_<group>.py``, each naming the entry it
covers; ``gptspec.conformance.registry.checks_for(entry_id)`` finds them. This module
only turns them into what a page shows: an id and a budget description.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CheckInfo:
    id: str
    budget: str  # how the check's tolerance is derived, in words or LaTeX
    description: str = ""
    ops: tuple[str, ...] = ()  # the backend operations it calls
    area: str = ""  # the suite it belongs to ("forward", "training", …), where known


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
    # the docstring before the summary: a summary line may wrap, and cutting it at its
    # first line left statements ending mid-sentence
    for name in ("doc", "description", "summary"):
        description = first_paragraph(_text(getattr(check, name, None)))
        if description:
            break
    return CheckInfo(id=str(check.id), budget=budget, description=description,
                     ops=tuple(getattr(check, "ops", ())), area=str(getattr(check, "area", "")))


def first_paragraph(doc: str) -> str:
    """A docstring's first paragraph (up to its first blank line) on one line: the check's
    whole statement, however many lines it was wrapped over. A paragraph that ends with a
    colon introduces what follows (a list): that is part of the statement too, its items
    marked with a bullet, so the statement does not stop at the colon."""
    paragraphs: list[list[str]] = [[]]
    for line in inspect.cleandoc(doc).splitlines():
        if not line.strip():
            if paragraphs[-1]:
                paragraphs.append([])
            continue
        paragraphs[-1].append(line.strip())
    lines = paragraphs[0]
    for more in paragraphs[1:]:
        if not lines or not lines[-1].endswith(":") or not more:
            break
        lines = lines + ["• " + line[2:] if line.startswith(("* ", "- ")) else line
                         for line in more]
    return " ".join(lines)


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
