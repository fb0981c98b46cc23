"""The Verification page: what is verified and how, generated from the code that does it.

Everything shown is read at build time: the budgets' model and λ from
``gptspec.conformance.budgets``, each check's full description (its docstring, with its
preconditions) from ``gptspec.conformance.registry``, the mutation catalog from
``meta.mutants`` and, where a catalog run was saved
(``python -m meta.mutation --json docs/mutation-results.json``), which check
killed each mutant; the soundness gate's runs from its ledger. Nothing here is typed by
hand, so the page cannot drift from the suite.
"""

from __future__ import annotations

import inspect
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sitegen.checks import is_direct
from sitegen.markup import code, esc, link, table
from sitegen.spec_pages import lambda_links

MUTATION_RESULTS = Path("docs") / "mutation-results.json"
KEYHOLE_RESULTS = Path("docs") / "keyhole-results.json"  # python -m meta.keyhole --json
LAMBDA = '<a class="gs-lambda" href="#budgets">λ</a>'  # to its definition, on this page
AREA_ORDER = ("forward", "tokenizer", "training", "generation", "costs")


class MutationResultsError(ValueError):
    """A saved mutation run that cannot be read; the message names the file."""


@dataclass(frozen=True)
class MutationRun:
    """A saved run of the mutation catalog: which check killed each mutant."""

    killed_by: dict[str, tuple[str, bool]]  # mutant → (check id or "", names a broken entry)
    provenance: str
    not_run: dict[str, str] = field(default_factory=dict)  # mutant → why (the machine lacks
    # the code path it mutates: an AVX-512 kernel)


def load_mutation_results(path: Path) -> MutationRun | None:
    """The saved catalog run, or None when there is none."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        results = data["results"]
        killed = {r["name"]: (str(r["killed_by"]), bool(r["on_target"])) for r in results}
        not_run = {r["name"]: str(r.get("detail", "")) for r in results
                   if r.get("status") == "not-run"}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise MutationResultsError(f"mutation results {path}: cannot be read: {err}") from None
    if data.get("schema") != "gptspec-mutation":
        raise MutationResultsError(f"mutation results {path}: not a gptspec-mutation file")
    prov = data.get("provenance") or {}
    commit = prov.get("commit")
    described = "; ".join([
        f"commit {commit[:10]}" if commit else "commit not recorded",
        str(prov.get("date") or "date not recorded"),
        ", ".join(str(prov[k]) for k in ("machine", "cpu") if prov.get(k)) or "machine?",
        f"profile {data.get('profile', '?')}, seed {data.get('seed', '?')}"])
    return MutationRun(killed, described, not_run)


def mutation_summary(mutants: Sequence[Any], run: MutationRun | None) -> str:
    """What the saved catalog run measured, in one sentence of Markdown: how many mutants
    were killed on target, and each one not run or survived with why. Read at build time,
    so the guides cannot claim more than the run showed."""
    if run is None:
        return ("No saved run of the catalog was found when this site was built: "
                "`nox -s mutants -- --json docs/mutation-results.json` makes one.")
    names = [m.name for m in mutants]
    on_target = [n for n in names if n in run.killed_by and n not in run.not_run
                 and run.killed_by[n][0] and run.killed_by[n][1]]
    off_target = [n for n in names if n in run.killed_by and n not in run.not_run
                  and run.killed_by[n][0] and not run.killed_by[n][1]]
    survived = [n for n in names if n in run.killed_by and n not in run.not_run
                and not run.killed_by[n][0]]
    not_run = [n for n in names if n in run.not_run]
    absent = [n for n in names if n not in run.killed_by]
    parts = [f"In the saved run of the catalog ({esc(run.provenance)}), "
             f"{len(on_target)} of {len(names)} mutants were killed on target"]
    if off_target:
        parts.append(f"{len(off_target)} by a check that names no entry the bug breaks")
    if survived:
        parts.append(f"{len(survived)} survived (" + ", ".join(f"`{n}`" for n in survived) + ")")
    if not_run:
        why = "; ".join(f"`{n}`: {_why_not_run(run.not_run[n])}" for n in not_run)
        parts.append(f"{len(not_run)} were not run on the machine that saved it ({why})")
    if absent:
        parts.append(f"{len(absent)} are newer than the run (" +
                     ", ".join(f"`{n}`" for n in absent) + ")")
    return "; ".join(parts) + "."


def _why_not_run(detail: str) -> str:
    detail = detail.strip() or "not run"
    # said by the machine that saved the run, read here on another
    return detail.removeprefix("not run: ").replace("this machine", "that machine")


def _docstring_html(doc: str) -> str:
    """A check's docstring as it is written (line breaks kept: its numbered conditions)."""
    text = esc(inspect.cleandoc(doc))
    text = re.sub(r"``([^`]+)``", r"<code>\1</code>", text)
    return f'<div class="gs-checkdoc">{text}</div>\n'


def _budget_section(budgets: Any) -> str:
    lam = budgets.LAMBDA
    tail = math.erfc(lam / math.sqrt(2))  # P(|Z| > λ) for a standard Gaussian error
    rows = [[code(name), f"2<sup>{round(math.log2(u))}</sup> = {u:.3g}"]
            for name, u in budgets.UNIT_ROUNDOFF.items()]
    doc = inspect.cleandoc(budgets.__doc__ or "")
    doc = re.sub(r":mod:`([^`]+)`", r"`\1`", doc).replace("``", "`")
    model = "\n\n".join(p for p in doc.split("\n\n")[1:])  # the title line is the heading
    # Markdown starts a list only after a blank line
    model = re.sub(r"(?<=[^\n])\n(?=\* )", "\n\n", model, count=1)
    model = model.replace("counted per\nfunction below", "counted per\nfunction in the module")
    return "\n".join([
        "## Budgets: the Higham–Mary bound and λ { #budgets }\n",
        f"Every tolerance in the suite is a budget **λ = {lam:g}** times an error scale "
        "propagated through the computation from the dtype's unit roundoff *u* and each "
        "reduction's length *n*. For a sum of length *n* the scale is √n·u·Σ|terms|, the "
        "probabilistic bound of Higham & Mary (2019): rounding errors independent and "
        "mean-zero, so they grow like √n, not n. A Gaussian error exceeds λ times its scale "
        f"with probability {tail:.1e} per element (computed here, erfc(λ/√2)); Higham & "
        "Mary's bound holds with probability at least 1 − 2n·exp(−λ²/2).\n",
        table(["dtype", "unit roundoff u"], rows),
        "How the scales are built (the docstring of `gptspec.conformance.budgets`):\n",
        model + "\n",
        "Each entry's page shows its own budget formula, and each check below the budget it "
        "applies.\n",
    ])


def _checks_section(checks: Sequence[Any], entry_ids: set[str], spec_dir: str) -> str:
    parts = ["## The checks\n",
             "Each check's full description, as its docstring states it: the property, and "
             "the preconditions under which the property must hold. *Differential* checks "
             "compare the backend with the float64 reference; *property* checks test a law "
             "the operation must obey.\n"]
    by_area: dict[str, list[Any]] = {}
    for c in checks:
        by_area.setdefault(c.area, []).append(c)
    for area in [a for a in AREA_ORDER if a in by_area] + sorted(set(by_area) - set(AREA_ORDER)):
        parts.append(f"### {area.capitalize()} ({len(by_area[area])} checks)\n")
        for c in by_area[area]:
            entries = ", ".join(link(f"{spec_dir}/{e}/", e) if e in entry_ids else esc(e)
                                for e in c.entries)
            facts = [f"{esc(c.kind)}", f"covers {entries}"]
            if c.ops:
                facts.append("calls " + ", ".join(code(o) for o in c.ops))
            if c.depends_on:
                facts.append("blocked by a failure of " + ", ".join(code(d) for d in c.depends_on))
            parts.append(f'<p class="gs-check-head" id="check-{esc(c.id.replace(".", "-"))}">'
                         f"{code(c.id)} · {' · '.join(facts)}</p>\n")
            parts.append(_docstring_html(c.doc or c.id))
            if c.budget:
                parts.append(f"<p><small>Budget: {lambda_links(esc(c.budget), LAMBDA)}"
                             "</small></p>\n")
    return "\n".join(parts)


def _mutation_section(mutants: Sequence[Any], run: MutationRun | None, spec_dir: str,
                      entry_ids: set[str]) -> str:
    parts = ["## The mutation catalog\n",
             f"{len(mutants)} realistic bugs planted in the PyTorch backend. The suite must "
             "kill each one with a check that names a spec entry the bug breaks: a bug no "
             "check notices is a hole in the suite.\n"]
    if run is None:
        parts.append("No saved run of the catalog was found when this site was built, so "
                     "the killing checks are not shown: run `nox -s mutants -- --json "
                     "docs/mutation-results.json` and rebuild.\n")
    else:
        parts.append(f"Killing checks from a saved run of the catalog ({esc(run.provenance)}).\n")
    rows = []
    for m in mutants:
        breaks = ", ".join(link(f"{spec_dir}/{e}/", e) if e in entry_ids else esc(e)
                           for e in m.breaks)
        if run is None:
            killed = "run <code>nox -s mutants</code>"
        elif m.name not in run.killed_by:
            killed = "not in the saved run"
        elif m.name in run.not_run:
            killed = esc(run.not_run[m.name] or "not run on the machine that saved the run")
        else:
            check_id, on_target = run.killed_by[m.name]
            killed = (code(check_id) + ("" if on_target else " (names no broken entry)")
                      if check_id else '<span class="gs-missing">survived</span>')
        rows.append([code(m.name), esc(m.area), breaks, esc(m.doc), killed])
    parts.append(table(["Mutant", "Suite", "Breaks", "The bug", "Killed by"], rows,
                       "gs-mutants"))
    return "\n".join(parts)


def _coverage_section(views: Sequence[Any], checks: Sequence[Any], spec_dir: str) -> str:
    by_id = {c.id: c for c in checks}
    links = sum(len(c.entries) for c in checks)
    rows, only_indirect = [], 0
    for v in views:
        e = v.entry.id
        mine = [by_id[c.id] for c in v.checks if c.id in by_id]
        direct = [c for c in mine if is_direct(e, c)]
        indirect = [c for c in mine if not is_direct(e, c)]
        only_indirect += not direct
        rows.append([link(f"{spec_dir}/{e}/", e),
                     "<br>".join(code(c.id) for c in direct) or "—",
                     "<br>".join(code(c.id) for c in indirect) or "—"])
    return "\n".join([
        "## Direct and indirect coverage\n",
        f"{len(checks)} checks cover {len(views)} entries through {links} entry–check links "
        "(a check may cover several entries). A check covers an entry **directly** when it "
        "calls the backend's operation of that name (for `gpt_forward`, the model's forward "
        "pass) or is the entry's own check; **indirectly** when the entry is exercised only "
        "inside a larger computation (the forward or backward pass, the tokenizer, "
        "generation), where a failure is seen but not localised to it. "
        f"{len(views) - only_indirect} entries are covered directly, {only_indirect} only "
        "indirectly.\n",
        table(["Entry", "Direct", "Indirect"], rows, "gs-coverage"),
    ])


def _load_saved(path: Path, what: str, schema: str, items: str) -> dict[str, Any] | None:
    """A saved run (JSON with ``schema`` and a list under ``items``), or None without one."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        ok = data.get("schema") == schema and isinstance(data.get(items), list)
    except (OSError, ValueError, AttributeError) as err:
        raise MutationResultsError(f"{what} {path}: cannot be read: {err}") from None
    if not ok:
        raise MutationResultsError(f"{what} {path}: not a {schema} file")
    return data


def load_keyhole_results(path: Path) -> dict[str, Any] | None:
    """The saved run of the catalog through the keyhole, or None when there is none."""
    return _load_saved(path, "keyhole results", "gptspec-keyhole", "results")


def keyhole_section(data: dict[str, Any] | None, spec_dir: str, entry_ids: set[str]) -> str:
    """Every forward-area mutant behind a wrapper that exposes only ``forward``: killed or
    not, where the probes point, counted from the saved run."""
    parts = ["## The catalog through the keyhole\n",
             "Each forward-area mutant behind a wrapper that exposes nothing but `forward`, "
             "as an inference runtime or an exported model does, run through the forward "
             "area: is it still killed, and do the probes (`probe.<entry>`) name the entry "
             "it breaks first (or in a tie of two)?\n"]
    if data is None:
        parts.append("No saved run was found when this site was built: run `nox -s keyhole` "
                      "and rebuild.\n")
        return "\n".join(parts)
    results = data["results"]
    applicable = [r for r in results if r.get("applicable")]
    killed = sum(bool(r.get("killed")) for r in applicable)
    localised = sum(bool(r.get("localised")) for r in applicable)
    prov = data.get("provenance") or {}
    parts.append(
        f"In the saved run (profile {esc(str(data.get('profile')))}, seed "
        f"{esc(str(data.get('seed')))}, commit {esc(str(prov.get('commit') or '?')[:10])}, "
        f"{esc(str(prov.get('date') or 'date unknown'))}), **{killed} of {len(applicable)}** "
        f"mutants that change the model's forward are killed through it, and "
        f"**{localised} of {len(applicable)}** are localised to their entry. "
        f"{len(results) - len(applicable)} leave the built-in forward unchanged (their "
        "operation is judged through its own check)."
        + ("" if data.get("complete", True) else
           " **A partial run**: the mutants not listed had not finished.") + "\n")
    rows = []
    for r in results:
        breaks = ", ".join(link(f"{spec_dir}/{e}/", e) if e in entry_ids else esc(e)
                           for e in r.get("breaks", []))
        if not r.get("applicable"):
            rows.append([code(r["name"]), breaks, "n/a", "-", "n/a"])
            continue
        named = ", ".join(esc(e) for e in r.get("named", [])) or "-"
        rows.append([code(r["name"]), breaks, "yes" if r.get("killed") else
                     '<span class="gs-missing">no</span>', named,
                     "yes" if r.get("localised") else "no"])
    parts.append(table(["Mutant", "Breaks", "Killed", "The probes point at", "Localised"],
                       rows, "gs-mutants"))
    missed = [r for r in results if r.get("applicable") and not r.get("localised")]
    if missed:
        parts.append("\nWhy the rest are not localised:\n")
        parts.extend(f"- {code(r['name'])}: {esc(r.get('why') or 'no account given yet.')}"
                     for r in missed)
        parts.append("")
    return "\n".join(parts)


SOUNDNESS_LEDGER = Path("meta") / "soundness" / "ledger.jsonl"  # the gate's --record
_A_GATE_RUN = {"judge", "backend", "dtype", "seed", "profile", "passed", "worst",
               "worst_check", "seconds"}


def load_soundness_ledger(path: Path) -> list[dict[str, Any]] | None:
    """The soundness gate's runs, one per line of its ledger, or None without a ledger."""
    if not path.exists():
        return None
    try:
        entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
                   if line.strip()]
    except (OSError, ValueError) as err:
        raise MutationResultsError(f"soundness ledger {path}: cannot be read: {err}") from None
    if not all(isinstance(e, dict) and _A_GATE_RUN <= e.keys() for e in entries):
        raise MutationResultsError(f"soundness ledger {path}: a line is not a run of the gate")
    return entries


def soundness_section(entries: list[dict[str, Any]] | None, current: list[dict[str, Any]],
                      summary: str) -> str:
    """The gate's runs on the code as built (``current``: those of the ledger's
    ``entries`` whose code is unchanged, meta.soundness.gate.current_runs); ``summary``: the
    gate's own count of them (meta.soundness.gate.ledger_summary)."""
    parts = ["## No false alarms: the soundness gate { #soundness }\n",
             "Backends that compute the model correctly but differently from the built-in one "
             "(the built-in one run in float64 with every result rounded once to the dtype, "
             "one written out again in PyTorch a head at a time, a NumPy one that emulates "
             "each dtype with every sum in reverse order, the built-in one compiled) must "
             "pass every check they implement, in float32, bfloat16 and float16, at the "
             "thorough profile (the compiled one at quick: it recompiles for every "
             "configuration) and at seeds drawn afresh: a failure would be a false alarm of "
             "the suite. `python -m meta.soundness.gate --record "
             f"{SOUNDNESS_LEDGER.as_posix()}` appends each run to the committed ledger. A run "
             "records the files of the project it loaded (the spec, the reference, the suite, "
             "the backends judged) with a digest of them and of the versions of the "
             "libraries that draw and compute the examples; it counts while that digest is "
             "unchanged, so that any change to what it ran starts the count again.\n"]
    if entries is None:
        parts.append("No ledger was found when this site was built: run the gate with "
                     "`--record` and rebuild.\n")
        return "\n".join(parts)
    parts.append("\n".join(f"- {esc(line)}" for line in summary.splitlines()) + "\n")
    mine = sorted(current,
                  key=lambda e: (str(e.get("when", "")), e["backend"], e["dtype"]))
    if mine:
        rows = [[esc(str(e["seed"])), code(str(e["backend"])), esc(str(e["dtype"])),
                 esc(str(e["profile"])), esc(str(e.get("area", "all"))),
                 "pass" if e["passed"] else '<span class="gs-missing">FAIL</span>',
                 f"{100 * float(e['worst']):.3g} %", code(str(e["worst_check"])),
                 f"{float(e['seconds']) / 60:.0f} min"] for e in mine]
        parts.append(table(["Seed", "Backend", "dtype", "Profile", "Area", "Verdict",
                            "Worst fraction of budget", "in", "Took"], rows, "gs-soundness"))
    return "\n".join(parts)


CUDA_RESULTS = Path("docs") / "cuda-results.json"  # python -m benchmarks.cuda_results


def load_cuda_results(path: Path) -> dict[str, Any] | None:
    """The saved record of the last GPU run, or None when there is none."""
    return _load_saved(path, "GPU results", "gptspec-cuda", "runs")


def _cuda_conformance_rows(run: dict[str, Any]) -> list[list[str]]:
    rows = []
    for c in run["conformance"]:
        n = c["counts"]
        worst = "-" if not c["worst"] else f"{100 * c['worst'][1]:.3g}% ({code(c['worst'][0])})"
        failed = ", ".join(code(i) for i in c["failed"]) or "-"
        rows.append([esc(c["target"]), esc(c["profile"]), esc(c["dtype"]), esc(c["area"]),
                     str(n.get("pass", 0)), str(n.get("fail", 0) + n.get("error", 0)),
                     str(n.get("blocked", 0)), str(c["unfinished"]), worst, failed])
    return rows


def cuda_section(data: dict[str, Any] | None) -> str:
    """The conformance verdicts and the benchmark of the last GPU run, as saved."""
    parts = ["## On a GPU\n"]
    if data is None:
        parts.append("No GPU run is saved: run `benchmarks/cuda_check.sh` on a CUDA machine, "
                     "then `python -m benchmarks.cuda_results` (its docstring says how).\n")
        return "\n".join(parts)
    parts.append(f"The last GPU runs ({esc(str(data.get('date')))}), one call of "
                 "`benchmarks/cuda_check.sh` and follow-up calls, each at the commit named. "
                 "The built-in backend on CUDA; the float64 reference on the CPU beside it. "
                 "Unfinished: checks that had not run when the call's time ran out "
                 "(counted, never passed).\n")
    header = ["Target", "Profile", "dtype", "Area", "Pass", "Fail", "Blocked", "Unfinished",
              "Worst pass, of budget", "Failed"]
    for i, run in enumerate(data["runs"], 1):
        env = run.get("environment") or {}
        where = (f"{esc(env['gpu'])}, driver {esc(env.get('driver', '?'))}, PyTorch "
                 f"{esc(env.get('torch', '?'))}, CUDA {esc(env.get('cuda', '?'))}"
                 if env.get("gpu") else "a fresh machine of the same kind")
        parts.append(f"### Call {i}: commit {code(run['commit'])}, {where}\n")
        if run.get("note"):
            parts.append(esc(run["note"]) + "\n")
        if run["conformance"]:
            parts.append(table(header, _cuda_conformance_rows(run), "gs-cuda"))
        bench = run.get("bench")
        if bench:
            rows = [[esc(m["group"]), esc(m["name"]), f"{m['median']:.4g}", esc(m["unit"])]
                    for m in bench["metrics"]]
            rows += [[esc(r["group"]), esc(r["name"]), f"{r['median']:.3g}",
                      esc(r["goal_text"]) + ("" if r["met"] is None else
                                             (" met" if r["met"] else " <strong>not met</strong>"))]
                     for r in bench["ratios"]]
            parts.append("\nThe GPU benchmark (`benchmarks/gpu.py`), alone on the device:\n")
            parts.append(table(["Group", "Measure", "Value", "Unit or goal"], rows, "gs-cuda"))
        for name, lines in sorted((run.get("outputs") or {}).items()):
            parts.append(f"\nOutput of the call's `{esc(name.removesuffix('.txt'))}` step:\n")
            parts.append("```text\n" + "\n".join(lines) + "\n```")
        parts.append("")
    return "\n".join(parts)


def verification_page(views: Sequence[Any], checks: Sequence[Any], mutants: Sequence[Any],
                      run: MutationRun | None, budgets: Any, spec_dir: str = "..",
                      keyhole: dict[str, Any] | None = None,
                      cuda: dict[str, Any] | None = None, soundness: str = "") -> str:
    """``views``: the entries (spec_pages.EntryView); ``checks``: the registry's checks;
    ``spec_dir``: the spec pages' folder relative to this page; ``soundness``: the
    soundness gate's section (soundness_section)."""
    entry_ids = {v.entry.id for v in views}
    kinds: dict[str, int] = {}
    for c in checks:
        kinds[c.kind] = kinds.get(c.kind, 0) + 1
    return "\n".join([
        "# Verification\n",
        "What is verified, and how. Three layers of evidence:\n",
        f"1. **The spec against itself.** Each of the {len(views)} entries' sympy forms is "
        "evaluated at 40 digits on random inputs and compared with the float64 reference "
        "function of the same name (`tests/test_spec_reference.py`); gradient entries are "
        "compared with sympy's derivative of their forward form, and the composed backwards "
        "with central differences (`tests/test_gradients.py`); the symbols table, LaTeX "
        "and shapes of each page agree (`tests/test_spec_consistency.py`).",
        f"2. **Any backend against the reference.** {len(checks)} conformance checks "
        f"({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}) generate inputs with "
        "Hypothesis, round them to the backend's dtype, run the backend and the float64 "
        "reference on the same rounded inputs, and compare within a derived budget.",
        f"3. **The suite against bugs.** {len(mutants)} mutants of the PyTorch backend, each "
        "a realistic bug, must each be killed by a check naming the entry it breaks.\n",
        _budget_section(budgets),
        _coverage_section(views, checks, spec_dir),
        _checks_section(checks, entry_ids, spec_dir),
        _mutation_section(mutants, run, spec_dir, entry_ids),
        keyhole_section(keyhole, spec_dir, entry_ids),
        soundness,
        cuda_section(cuda),
    ]) + "\n"
