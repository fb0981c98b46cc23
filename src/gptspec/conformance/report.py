"""The report of a run: a line per check for the terminal, JSON and a Markdown summary.

The JSON is a versioned schema (``"schema": "gptspec-conformance"``, version 4, with the
conformance ``protocol`` the suite spoke); docs/conformance-report.md documents every
field and the version history, and a change here changes it there. ``status`` is one of
pass, fail, not-implemented, not-applicable, blocked, error; ``worst_fraction`` is the
largest |actual − reference| / budget over the check's comparisons (null when it made
none or one was infinite), and a check passes only if it is ≤ 1. ``provenance`` says
what produced the results: the git commit and whether tracked files differed from it,
the UTC start date, the machine, its CPU, cores and Python.
"""

from __future__ import annotations

import datetime
import html
import json
import math
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

from gptspec.atomic_files import write_text
from gptspec.conformance.protocol import PROTOCOL_VERSION
from gptspec.conformance.runner import CheckResult, SuiteResult

SCHEMA = "gptspec-conformance"
VERSION = 4

MARK = {"pass": "PASS", "fail": "FAIL", "not-implemented": "N/I ", "not-applicable": "N/A ",
        "blocked": "BLKD", "error": "ERR "}


def named(backend: dict[str, str]) -> str:
    """A backend's name and version as one phrase: the version alone where it begins with
    the name already (name "tiktoken", version "tiktoken 0.12": not "tiktoken tiktoken")."""
    name, version = backend["name"], backend["version"]
    if not version or version.split(" ", 1)[0].lower() == name.lower():
        return version or name
    return f"{name} {version}"


def header(suite: SuiteResult) -> str:
    b, s = suite.backend, suite.settings
    return (f"gptspec conformance (protocol {PROTOCOL_VERSION}) — backend {named(b)} "
            f"on {b['device']}, {b['dtype']}; profile {s['profile']} "
            f"({s['examples_per_property']} examples per property), seed {s['seed']}"
            + (f", {s['timeout_s']:g} s per check" if s.get("timeout_s") else "")
            + (", isolated in a worker process" if s.get("isolated") else ""))


def fraction_text(r: CheckResult) -> str:
    if r.worst_fraction is None:
        return "-"
    if r.worst_fraction == float("inf"):
        return "inf"
    return f"{100 * r.worst_fraction:.3g}%"


def line(r: CheckResult) -> str:
    text = f"{MARK[r.status]}  {r.id:<44} {fraction_text(r):>9} of budget  {r.seconds:6.2f}s"
    if r.status != "pass":
        text += f"\n      {r.detail}"
        if r.minimal_example:
            text += "\n      " + r.minimal_example.replace("\n", "\n      ")
        if r.adjudication and r.adjudication.get("note"):
            text += f"\n      adjudication: {r.adjudication['note']}"
        if r.reproduce:
            text += f"\n      reproduce: {r.reproduce}"
        for path in r.saved:
            text += f"\n      saved: {path}"
    return text


def summary(suite: SuiteResult) -> str:
    if suite.refused:
        return f"refused: {suite.refused} (nothing was judged in this run)"
    c = suite.counts
    skipped = sum(r.not_applicable for r in suite.results if r.status != "not-applicable")
    text = (f"{c['pass']} passed, {c['fail'] + c['error']} failed, {c['blocked']} blocked, "
            f"{c['not-implemented']} not implemented"
            + (f", {c['not-applicable']} not applicable" if c.get("not-applicable") else "")
            + (f"; {skipped} examples declared not applicable skipped" if skipped else ""))
    found = localisation(suite)
    if found:
        text += (f"\nthe probes point at: {', '.join(found['suspects'])} (smallest failing "
                 f"probe: {found['smallest_failing_probe']})")
    return text


def localisation(suite: SuiteResult) -> dict[str, Any] | None:
    """Where the forward-alone probes point when some failed: the suspected entries
    (checks_probes.localise) and the failing probe whose logits depend on fewest entries.
    Only probes that passed or failed are evidence: one that erred (raised, ran out of
    time, crashed its worker) says nothing about which equation is wrong."""
    from gptspec.conformance.checks_probes import PROBES, localise

    outcomes = {r.id.removeprefix("probe."): r.status == "pass" for r in suite.results
                if r.id.startswith("probe.") and r.status in ("pass", "fail")}
    failing = [e for e, passed in outcomes.items() if not passed and e in PROBES]
    if not failing:
        return None
    # budgets.compare's words for a NaN or an infinity where the reference has none
    nonfinite = {r.id.removeprefix("probe.") for r in suite.results
                 if r.id.startswith("probe.") and r.status == "fail"
                 and re.search(r"NaN at|got -?(inf|nan)\b", r.detail or "")}
    smallest = min(failing, key=lambda e: (len(PROBES[e].support), e))
    return {"suspects": localise(outcomes, nonfinite),
            "smallest_failing_probe": f"probe.{smallest}"}


def _git(*args: str) -> str | None:
    """A git command's output in the source folder, or None (no git, not a checkout)."""
    try:
        done = subprocess.run(["git", *args], cwd=Path(__file__).resolve().parent,
                              capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def _cpu() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what platform knows."""
    try:
        for text_line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if text_line.startswith("model name"):
                return text_line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance() -> dict:
    """What produced a report: commit, date, machine; device, dtype and profile are per run."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit or None,
            "modified": None if status is None else bool(status),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": platform.platform(), "cpu": _cpu(), "cores": os.cpu_count(),
            "python": platform.python_version()}


def to_json(suites: list[SuiteResult], started: dict | None = None) -> dict:
    """``started``: the provenance taken when the run began (default: taken now)."""
    return {"schema": SCHEMA, "version": VERSION, "protocol": PROTOCOL_VERSION,
            "provenance": started or provenance(),
            "runs": [{"backend": s.backend, "settings": s.settings, "counts": s.counts,
                      "checks": [r.to_dict() for r in s.results],
                      **({"refused": s.refused} if s.refused else {}),
                      **({"localisation": found} if (found := localisation(s)) else {})}
                     for s in suites]}


def to_markdown(suites: list[SuiteResult]) -> str:
    out = []
    for s in suites:
        # what a backend names itself is text, never markup, wherever the file is rendered
        name, device, dtype = (html.escape(s.backend[k]) for k in ("name", "device", "dtype"))
        out += [f"### {name} · {device} · {dtype}", "",
                f"{html.escape(summary(s), quote=False)} (profile {s.settings['profile']}, seed "
                f"{s.settings['seed']})", ""]
        if s.refused:  # declined while being built: no checks ran
            continue
        out += ["| check | spec entries | status | worst error / budget | time (s) |",
                "| --- | --- | --- | --- | --- |"]
        for r in s.results:
            out.append(f"| `{r.id}` | {', '.join(r.entries)} | {r.status} | {fraction_text(r)} "
                       f"| {r.seconds:.2f} |")
        out.append("")
    return "\n".join(out)


def write_atomically(path: str | Path, text: str) -> None:
    """Write a report file whole (temporary name, then rename), making its folder."""
    write_text(path, text, make_parents=True)


def _finite(value: Any) -> Any:
    """JSON has no ∞ or NaN: an unbounded fraction is written as null (see the schema)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def write_json(path: str | Path, suites: list[SuiteResult], started: dict | None = None) -> None:
    write_atomically(path, json.dumps(_finite(to_json(suites, started)), indent=2,
                                      allow_nan=False, default=str) + "\n")
