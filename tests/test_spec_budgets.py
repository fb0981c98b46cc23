"""One budget per entry: a spec entry's tolerance states the budget its own check computes.

An entry's own check (id ``<entry>.…``, the first of them that registers a budget text) is
what the docs site states as the entry's budget and what reports carry; ``gptspec.spec``
consumers read the entry's Tolerance. So the two must agree: a check that compares exactly
goes with the formula ``0``; any other check's budget text appears, as written, in the
tolerance's note beside the LaTeX formula and its derivation.
"""

from __future__ import annotations

import re

import pytest

from gptspec.conformance.registry import checks_for
from gptspec.spec import REGISTRY


def _own_budget(entry_id: str) -> str:
    own = [c for c in checks_for(entry_id) if c.id.split(".")[0] == entry_id and c.budget]
    return own[0].budget if own else ""


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


JUDGED = [(e, b) for e in REGISTRY if e.tolerance is not None and (b := _own_budget(e.id))]


def disagreement(tolerance, budget: str) -> str:
    """Why a tolerance and its check's budget text disagree ('' where they agree)."""
    if budget.startswith("exact"):
        return "" if tolerance.formula.strip() == "0" else (
            f"the check compares exactly ({budget!r}) but the spec allows {tolerance.formula!r}")
    if _flat(budget) not in _flat(tolerance.note):
        return f"the check's budget {budget!r} is not stated in the tolerance's note"
    return ""


def test_entries_judged_on_their_own_exist() -> None:
    assert len(JUDGED) > 30


@pytest.mark.parametrize(("entry", "budget"), JUDGED, ids=[e.id for e, _ in JUDGED])
def test_spec_tolerance_states_its_checks_budget(entry, budget) -> None:
    found = disagreement(entry.tolerance, budget)
    assert not found, f"{entry.id}: {found}"
