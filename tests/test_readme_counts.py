"""The figures the README states about what is verified are the project's own: the spec
entries by group, the decisions, the checks by area and the mutants. A change that adds
one updates the README, or this fails."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from gptspec.conformance.registry import all_checks
from gptspec.spec import REGISTRY

README = " ".join((Path(__file__).resolve().parent.parent / "README.md").read_text(
    encoding="utf-8").split())


def _stated(pattern: str) -> re.Match:
    found = re.search(pattern, README)
    assert found, f"the README no longer states {pattern!r}"
    return found


def _by_name(listing: str) -> dict[str, int]:
    return {name: int(n) for name, n in (part.rsplit(" ", 1) for part in listing.split(", "))}


def test_spec_entries_by_group_and_decisions():
    stated = _stated(r"\*\*(\d+) spec entries\*\* \(([^)]*)\) recording \*\*(\d+) decisions\*\*")
    entries = list(REGISTRY)
    assert int(stated[1]) == len(entries)
    assert _by_name(stated[2]) == dict(Counter(e.group for e in entries))
    assert int(stated[3]) == sum(len(e.decisions) for e in entries)


def test_checks_by_area():
    stated = _stated(r"\*\*(\d+) conformance checks\*\* \(([^)]*)\)")
    checks = all_checks(None)
    assert int(stated[1]) == len(checks)
    assert _by_name(stated[2]) == dict(Counter(c.area for c in checks))


def test_mutants():
    from meta.mutants import MUTANTS

    assert int(_stated(r"\*\*(\d+) mutants\*\*")[1]) == len(MUTANTS)
