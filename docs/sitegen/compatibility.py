"""The Compatibility page: what each engine of the ecosystem passes, from the reports that
``nox -s ecosystem`` writes to ``docs/ecosystem/`` (one per engine × dtype).

Each group of engines opens with a matrix of checks × engine and dtype (drawn as the
Conformance results page draws its own); then for each engine and dtype: counts per check
area (pass, fail, not applicable, not implemented, blocked), the worst budget use, the
provenance of the run, and every failure with its adjudication from
``docs/ecosystem/adjudications.toml``. A failure that no adjudication covers is an error
(:class:`CompatibilityError`), so the site cannot publish a failure unexplained.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sitegen.evidence import stale_banner
from sitegen.markup import code, esc, table
from sitegen.spec_pages import MATRIX_LEGEND, percent, status_matrix

AREA_ORDER = ("forward", "tokenizer", "training", "generation", "costs")
COUNTED = ("pass", "fail", "not-applicable", "not-implemented", "blocked", "error")
HEADINGS = {"pass": "pass", "fail": "fail", "not-applicable": "not applicable",
            "not-implemented": "not implemented", "blocked": "blocked", "error": "error"}
HEADER = [*(HEADINGS[s] for s in COUNTED), "worst error / budget"]


class CompatibilityError(ValueError):
    """A report that cannot be read, or a failure without an adjudication."""


@dataclass(frozen=True)
class EngineRun:
    """One engine in one dtype: a report's run."""

    path: Path
    engine: str
    dtype: str
    version: str
    provenance: str
    profile: str
    checks: tuple[dict[str, Any], ...]
    commit: str = ""  # the gptspec commit that produced it, where the report records one


def _provenance(data: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    prov = data.get("provenance") if isinstance(data.get("provenance"), dict) else {}
    assert isinstance(prov, dict)
    commit = prov.get("commit")
    source = (f"gptspec commit {commit[:10]}" + (" with local changes" if prov.get("modified")
                                                 else "")
              if isinstance(commit, str) and commit else "gptspec commit not recorded")
    cpu = str(prov.get("cpu") or "CPU not recorded")
    if prov.get("cores"):
        cpu += f" ({prov['cores']} logical cores)"
    settings = run.get("settings") if isinstance(run.get("settings"), dict) else {}
    assert isinstance(settings, dict)
    return "; ".join([source, str(prov.get("date") or "date not recorded"),
                      str(prov.get("machine") or "machine not recorded"), cpu,
                      f"profile {settings.get('profile', '?')}, seed {settings.get('seed', '?')}"])


def _commit(data: Mapping[str, Any]) -> str:
    prov = data.get("provenance")
    commit = prov.get("commit") if isinstance(prov, dict) else None
    return commit if isinstance(commit, str) else ""


def load_runs(folder: Path) -> list[EngineRun]:
    """Every run of every report in ``folder`` (``*.json``), in file order."""
    runs = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            items = data["runs"]
            if data.get("schema") != "gptspec-conformance":
                raise ValueError("not a gptspec-conformance report")
            for run in items:
                backend = run["backend"]
                runs.append(EngineRun(
                    path=path, engine=str(backend["name"]), dtype=str(backend["dtype"]),
                    version=str(backend.get("version", "?")),
                    provenance=_provenance(data, run),
                    profile=str(run.get("settings", {}).get("profile", "?")),
                    checks=tuple(run["checks"]),
                    commit=_commit(data)))
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise CompatibilityError(f"ecosystem report {path}: cannot be read: {err}") from None
    return runs


def _worst(checks: Sequence[Mapping[str, Any]]) -> str:
    """The largest error / budget over the checks that compared anything; ∞ for a check
    that failed with no finite fraction (a NaN, a wrong shape)."""
    if any(c.get("status") == "fail" and c.get("worst_fraction") is None for c in checks):
        return "∞"
    fractions = [c["worst_fraction"] for c in checks
                 if isinstance(c.get("worst_fraction"), (int, float))]
    return percent(max(fractions)) if fractions else "—"


def _counts_row(label: str, checks: Sequence[Mapping[str, Any]]) -> list[str]:
    row = [label]
    for status in COUNTED:
        n = sum(c.get("status") == status for c in checks)
        row.append(f'<span class="gs-status gs-{status}">{n}</span>' if n and status != "pass"
                   else str(n))
    return row + [_worst(checks)]


def _by_area(run: EngineRun, area_of: Mapping[str, str]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for c in run.checks:
        groups.setdefault(area_of.get(str(c.get("id")), "other"), []).append(c)
    order = [a for a in AREA_ORDER if a in groups] + sorted(set(groups) - set(AREA_ORDER))
    return {a: groups[a] for a in order}


def _failure(run: EngineRun, check: Mapping[str, Any], adjudications: Sequence[Any],
             verdicts: Mapping[str, str]) -> str:
    found = next((a for a in adjudications
                  if a.covers(run.engine, str(check["id"]), run.dtype)), None)
    if found is None:
        raise CompatibilityError(
            f"{run.path.name}: {run.engine} {run.dtype} {check['status']}s {check['id']} "
            "and no adjudication in docs/ecosystem/adjudications.toml explains it")
    parts = [f'<p class="gs-check-head">{code(str(check["id"]))} · '
             f'<span class="gs-status gs-{esc(check["status"])}">{esc(check["status"])}</span>'
             f" · worst {percent(check.get('worst_fraction'))} of budget · "
             f"<strong>{esc(verdicts[found.verdict])}</strong></p>\n",
             f"<p>{esc(found.reason)}</p>\n",
             f"<p><small>What the suite measured: {esc(str(check.get('detail', '')))}"
             "</small></p>\n",
             "<p><small>Smallest input:</small></p>\n",
             f"<pre><code>{esc(found.smallest_input)}</code></pre>\n"]
    if check.get("minimal_example"):
        parts += ["<p><small>Hypothesis's minimal example in this run:</small></p>\n",
                  f"<pre><code>{esc(str(check['minimal_example']))}</code></pre>\n"]
    return "".join(parts)


def _run_section(run: EngineRun, adjudications: Sequence[Any], verdicts: Mapping[str, str],
                 area_of: Mapping[str, str], head: str = "", root: Path | None = None) -> str:
    # area_of holds every check of the suite: the report is compared with it
    banner = stale_banner(f"This report ({run.path.name})", (str(c.get("id")) for c in run.checks),
                          area_of, run.commit, head, root)
    parts = [f"### {run.engine} · {run.dtype}\n", banner,
             f'<p class="gs-provenance"><small>{esc(run.version)}. Produced by: '
             f"{esc(run.provenance)}.</small></p>\n",
             table(["area", *HEADER], [_counts_row(esc(area), checks)
                                       for area, checks in _by_area(run, area_of).items()],
                   "gs-compat")]
    failed = [c for c in run.checks if c.get("status") in ("fail", "error")]
    if failed:
        parts.append(f"**Failures ({len(failed)}).**\n")
        parts += [_failure(run, c, adjudications, verdicts) for c in failed]
    return "\n".join(parts)


def _dtype_rank(engines: Sequence[Any], run: EngineRun) -> int:
    """A run's place among its engine's dtypes, as the table lists them."""
    dtypes = next((list(e.dtypes) for e in engines if e.backend == run.engine), [])
    return dtypes.index(run.dtype) if run.dtype in dtypes else len(dtypes)


def _matrix(runs: Sequence[EngineRun]) -> str:
    """Checks × these runs (engine · dtype), as the Conformance results page draws them;
    every failure and error is adjudicated (the page does not build otherwise), marked †."""
    def fraction(c: Mapping[str, Any]) -> float | None:
        f = c.get("worst_fraction")
        return float(f) if isinstance(f, (int, float)) else None

    matrix = status_matrix([f"{code(r.engine)} · {esc(r.dtype)}" for r in runs],
                           [[(str(c.get("id")), str(c.get("status")), fraction(c))
                             for c in r.checks] for r in runs],
                           {"fail": "†", "error": "†"})
    return (matrix + f"\n<p><small>{esc(MATRIX_LEGEND)} †: adjudicated in the engine's "
            "section below.</small></p>\n")


def _groups(runs: Sequence[EngineRun], independent: Sequence[Any],
            rewritten: Sequence[Any]) -> str:
    """The summary: one table of the independent implementations (engines nobody here
    wrote: their agreement is evidence about the spec), one of the spec's equations
    re-written here in other frameworks (evidence about the frameworks only), and any
    report of an engine the table does not list."""
    parts = []
    listed = {e.backend for e in [*independent, *rewritten]}
    areas = sorted({a for e in independent for a in getattr(e, "areas", ())})
    groups = [
        ("Independent implementations", independent,
         f"{len(independent)} implementations nobody here wrote, across "
         f"{len(areas)} areas ({', '.join(areas)}): each computes the spec its own way, so "
         "where it agrees the spec and the engine agree, and where it differs the "
         "adjudication says which reads what."),
        ("The spec re-written in other frameworks", rewritten,
         "The spec's equations written here again in JAX and in ONNX graphs: they test the "
         "frameworks and the suite's dtype budgets, not the spec's reading, since the same "
         "people wrote both sides."),
    ]
    unlisted = sorted({r.engine for r in runs} - listed)
    for title, members, lead in groups:
        names = {e.backend for e in members}
        mine = [r for r in runs if r.engine in names]
        parts.append(f"**{title}.** {esc(lead)}\n")
        if mine:
            parts.append(_matrix(mine))
            parts.append(table(["engine, dtype", *HEADER],
                               [_counts_row(f"{code(r.engine)} {esc(r.dtype)}", r.checks)
                                for r in mine], "gs-compat"))
    if unlisted:
        mine = [r for r in runs if r.engine in unlisted]
        parts.append("**Engines outside the ecosystem's table.**\n")
        parts.append(_matrix(mine))
        parts.append(table(["engine, dtype", *HEADER],
                           [_counts_row(f"{code(r.engine)} {esc(r.dtype)}", r.checks)
                            for r in mine], "gs-compat"))
    return "\n".join(parts)


def compatibility_page(runs: Sequence[EngineRun], engines: Sequence[Any],
                       adjudications: Sequence[Any], verdicts: Mapping[str, str],
                       area_of: Mapping[str, str], head: str = "", root: Path | None = None
                       ) -> str:
    """``engines``: the ecosystem's table (``backend``, ``dtypes``, ``what``);
    ``adjudications``: the committed table; ``area_of``: check id → the suite's area, for
    every check of the suite; ``head``: the commit the site is built from ("" unknown),
    ``root`` the checkout (to count the commits between a report's and ``head``)."""
    parts = [
        "# Compatibility\n",
        "Engines nobody here wrote, run through the same conformance suite as the built-in "
        "backend, in every dtype each computes in (`nox -s ecosystem`, which writes one JSON "
        "report per engine and dtype to `docs/ecosystem/`). *Not applicable*: every example "
        "of the check was a configuration the engine declares it cannot express (GPT-2 has "
        "no post-LN block, for one); *not implemented*: the engine exposes no such "
        "operation, or does not implement the check's area at all (a tokenizer has no "
        "model); *blocked*: a check this one depends on failed. Every failure below is "
        "adjudicated — the engine's behaviour, a decision of the spec the engine reads "
        "differently, or a false alarm of the suite — from the committed table "
        "`docs/ecosystem/adjudications.toml`; the site does not build with a failure it "
        "cannot explain.\n",
    ]
    independent = [e for e in engines if getattr(e, "independent", True)]
    rewritten = [e for e in engines if not getattr(e, "independent", True)]
    engines = [*independent, *rewritten]  # the page lists them in these two groups
    rank = {e.backend: i for i, e in enumerate(engines)}
    runs = sorted(runs, key=lambda r: (rank.get(r.engine, len(rank)), r.engine,
                                       _dtype_rank(engines, r)))
    stale = [r for r in runs if {str(c.get("id")) for c in r.checks} != set(area_of)]
    if stale:
        parts.append(f'<div class="admonition warning gs-stale">\n<p class="admonition-title">'
                     f"Stale evidence</p>\n<p>{len(stale)} of these {len(runs)} reports ran "
                     f"another set of checks than the suite's {len(area_of)}: each one's "
                     "section below names the difference.</p>\n</div>\n")
    parts.append(_groups(runs, independent, rewritten))
    listed = {e.backend for e in engines}
    # a report of an engine the table does not list is shown, not dropped
    unlisted = [SimpleNamespace(backend=name, what="An engine outside the ecosystem's table",
                                dtypes=sorted({r.dtype for r in runs if r.engine == name}))
                for name in sorted({r.engine for r in runs} - listed)]
    for engine in [*engines, *unlisted]:
        mine = [r for r in runs if r.engine == engine.backend]
        parts.append(f"## {engine.backend}\n")
        kind = ("An independent implementation" if getattr(engine, "independent", True)
                else "The spec re-written here in another framework")
        areas = getattr(engine, "areas", ())
        judged = f" Areas judged: {', '.join(areas)}." if areas else ""
        parts.append(f"*{kind}.* {esc(engine.what)}. Dtypes: {', '.join(engine.dtypes)}."
                     f"{esc(judged)}\n")
        missing = [d for d in engine.dtypes if d not in {r.dtype for r in mine}]
        if missing:
            parts.append(f'<p class="gs-not-run">Not yet run in {", ".join(missing)}: '
                         "<code>nox -s ecosystem</code> writes the reports.</p>\n")
        parts += [_run_section(r, adjudications, verdicts, area_of, head, root) for r in mine]
    return "\n".join(parts) + "\n"
