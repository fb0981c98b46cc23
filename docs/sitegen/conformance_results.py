"""The latest conformance results of the built-in backends, read from JSON reports.

``gptspec conformance --report FILE`` writes a report (schema ``gptspec-conformance``,
documented in gptspec.conformance.report) holding one run per backend, device and dtype.
The site reads every
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
    provenance: str = ""  # "commit …, date, machine, CPU; profile …, device …, dtype …"
    commit: str = ""  # the commit that produced it, where the report records one
    area: str = ""  # the one area it ran (--area), "" for every area

    def for_entry(self, entry_id: str) -> list[CheckResult]:
        return [r for r in self.results if entry_id in r.entries]


def report_paths(root: Path) -> list[Path]:
    named = os.environ.get(REPORTS_ENV, "")
    if named:
        return [Path(p) for p in named.split(os.pathsep) if p]
    folder = root / DEFAULT_REPORT_DIR
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


SCHEMA = "gptspec-conformance"
VERSIONS = (1, 2, 3, 4)  # 2 added settings.timeout_s, isolated, saved and adjudication;
# 3 the status not-applicable, checks[].not_applicable and provenance; 4 protocol


def _describe_backend(info: Any) -> str:
    if not isinstance(info, dict):
        return "unnamed backend"
    name = " ".join(str(info[k]) for k in ("name", "version") if info.get(k))
    rest = [str(info[k]) for k in ("device", "dtype") if info.get(k)]
    return " · ".join([name or "unnamed backend", *rest])


def _describe_settings(settings: Any) -> str:
    if isinstance(settings, dict):
        return ", ".join(f"{k} {v}" for k, v in settings.items())
    return str(settings or "")


def _describe_provenance(data: dict, run: dict) -> str:
    """Which commit, date, machine, profile, device and dtype produced a run's results;
    what a report (before version 3) does not record is said to be unrecorded."""
    prov = data.get("provenance")
    prov = prov if isinstance(prov, dict) else {}
    commit = prov.get("commit")
    if isinstance(commit, str) and commit:
        source = f"commit {commit[:10]}" + (" with local changes" if prov.get("modified") else "")
    else:
        source = "commit not recorded"
    machine = ", ".join(str(prov[k]) for k in ("machine", "cpu") if prov.get(k))
    backend = run.get("backend") if isinstance(run.get("backend"), dict) else {}
    settings = run.get("settings") if isinstance(run.get("settings"), dict) else {}
    parts = [source, str(prov.get("date") or "date not recorded"),
             machine or "machine not recorded",
             f"profile {settings.get('profile', '?')}",
             f"device {backend.get('device', '?')}", f"dtype {backend.get('dtype', '?')}"]
    return "; ".join(parts)


def _area(settings: Any) -> str:
    area = settings.get("area") if isinstance(settings, dict) else None
    return area if isinstance(area, str) and area != "all" else ""


def _commit(data: dict) -> str:
    prov = data.get("provenance")
    commit = prov.get("commit") if isinstance(prov, dict) else None
    return commit if isinstance(commit, str) else ""


def _check_result(item: Any, path: Path) -> CheckResult:
    if not isinstance(item, dict) or not isinstance(item.get("id"), str):
        raise ReportError(f"conformance report {path}: a check without an id: {item!r:.80}")
    entries = item.get("entries") or ()
    if isinstance(entries, str) or not all(isinstance(e, str) for e in entries):
        raise ReportError(f"conformance report {path}: check {item['id']!r} has no list of "
                          "entries")
    fraction = item.get("worst_fraction")
    if fraction is not None and (isinstance(fraction, bool)
                                 or not isinstance(fraction, (int, float))):
        raise ReportError(f"conformance report {path}: check {item['id']!r} has a "
                          f"non-numeric worst_fraction {fraction!r}")
    message = item.get("detail") or ""
    if item.get("blocked_by"):
        message = f"blocked by {item['blocked_by']}" + (f": {message}" if message else "")
    return CheckResult(
        check_id=item["id"],
        entries=tuple(entries),
        status=str(item.get("status", "unknown")),
        budget_fraction=None if fraction is None else float(fraction),
        message=str(message),
    )


def load_report(path: Path) -> list[BackendReport]:
    """Every run (a backend on a device in a dtype) in one report file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ReportError(f"conformance report {path}: cannot be read: {err}") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ReportError(f"conformance report {path}: not a {SCHEMA} report")
    if data.get("version") not in VERSIONS:
        raise ReportError(f"conformance report {path}: schema version {data.get('version')!r} "
                          f"is not one this site reads ({VERSIONS})")
    runs = data.get("runs")
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        raise ReportError(f"conformance report {path}: no list of runs")
    reports = []
    for run in runs:
        checks = run.get("checks")
        if not isinstance(checks, list):
            raise ReportError(f"conformance report {path}: a run without a list of checks")
        reports.append(BackendReport(
            path=path,
            backend=_describe_backend(run.get("backend")),
            settings=_describe_settings(run.get("settings")),
            results=tuple(_check_result(c, path) for c in checks),
            provenance=_describe_provenance(data, run),
            commit=_commit(data),
            area=_area(run.get("settings")),
        ))
    return reports


def load_reports(root: Path) -> list[BackendReport]:
    return [run for p in report_paths(root) for run in load_report(p)]
