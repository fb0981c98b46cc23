"""The latest conformance results of the built-in backends, read from JSON reports.

``gptspec conformance --report FILE`` writes one report per run. The site reads every
``*.json`` under ``out/conformance/`` (or the files named in the environment variable
``GPTSPEC_CONFORMANCE_REPORTS``, separated by ``os.pathsep``) and shows, on each entry's
page, the status of that entry's checks for each backend. With no report, pages say the
suite has not been run yet; a report that cannot be read is a build error (a stale or
corrupt report must not pass silently as "no results").
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPORTS_ENV = "GPTSPEC_CONFORMANCE_REPORTS"
DEFAULT_REPORT_DIR = Path("out") / "conformance"


class ReportError(ValueError):
    """A conformance report that cannot be read; the message names the file."""


@dataclass(frozen=True)
class CheckResult:
    check_id: str
    entries: tuple[str, ...]
    status: str
    budget_fraction: float | None  # worst error as a fraction of the budget
    message: str = ""


@dataclass(frozen=True)
class BackendReport:
    path: Path
    backend: str  # "name version · device · dtype"
    settings: str
    results: tuple[CheckResult, ...] = field(default=())

    def for_entry(self, entry_id: str) -> list[CheckResult]:
        return [r for r in self.results if entry_id in r.entries]


def report_paths(root: Path) -> list[Path]:
    named = os.environ.get(REPORTS_ENV, "")
    if named:
        return [Path(p) for p in named.split(os.pathsep) if p]
    folder = root / DEFAULT_REPORT_DIR
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


def _first(mapping: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if key in mapping and mapping[key] is not None:
            return mapping[key]
    return default


def _describe_backend(data: dict[str, Any]) -> str:
    info = _first(data, "backend", "header", default={})
    if isinstance(info, str):
        return info
    if not isinstance(info, dict):
        return "unnamed backend"
    name = " ".join(str(info[k]) for k in ("name", "version") if info.get(k))
    rest = [str(info[k]) for k in ("device", "dtype") if info.get(k)]
    return " · ".join([name or "unnamed backend", *rest])


def _describe_settings(data: dict[str, Any]) -> str:
    settings = _first(data, "settings", "suite", default={})
    if isinstance(settings, dict):
        return ", ".join(f"{k} {v}" for k, v in settings.items())
    return str(settings)


def _check_result(item: Any, path: Path) -> CheckResult:
    if not isinstance(item, dict) or "id" not in item:
        raise ReportError(f"{path}: a check result without an 'id': {item!r:.80}")
    entries = _first(item, "entries", "spec_entries", "entry", "spec_entry", default=())
    if isinstance(entries, str):
        entries = (entries,)
    fraction = _first(item, "budget_fraction", "worst_fraction", "fraction_of_budget", "worst")
    if isinstance(fraction, dict):  # {"fraction": ..., ...}
        fraction = _first(fraction, "fraction", "budget_fraction")
    try:
        fraction = None if fraction is None else float(fraction)
    except (TypeError, ValueError):
        raise ReportError(f"{path}: check {item['id']!r} has a non-numeric error "
                          f"fraction {fraction!r}") from None
    return CheckResult(
        check_id=str(item["id"]),
        entries=tuple(str(e) for e in entries),
        status=str(_first(item, "status", default="unknown")),
        budget_fraction=fraction,
        message=str(_first(item, "message", "blocked_by", default="")),
    )


def load_report(path: Path) -> BackendReport:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ReportError(f"conformance report {path}: cannot be read: {err}") from None
    if not isinstance(data, dict):
        raise ReportError(f"conformance report {path}: expected a JSON object")
    checks = _first(data, "checks", "results", default=None)
    if not isinstance(checks, list):
        raise ReportError(f"conformance report {path}: no list of 'checks'")
    return BackendReport(
        path=path,
        backend=_describe_backend(data),
        settings=_describe_settings(data),
        results=tuple(_check_result(c, path) for c in checks),
    )


def load_reports(root: Path) -> list[BackendReport]:
    return [load_report(p) for p in report_paths(root)]
