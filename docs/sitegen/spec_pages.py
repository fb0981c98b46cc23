"""Markdown pages generated from the spec registry: one per entry, an index by group,
the traceability matrix, and the conformance results.

Pages are plain strings; :func:`write_pages` puts them under a folder and returns the
navigation. Every entry in the registry gets a page; the traceability matrix lists, for
each, its reference function, its conformance checks and its page, and
:class:`TraceabilityError` is raised when any of those is missing.
"""

from __future__ import annotations

import html
import inspect
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

from sitegen import drawn
from sitegen.checks import CheckInfo, is_direct
from sitegen.conformance_results import BackendReport
from sitegen.evidence import stale_banner
from sitegen.examples import Example, worked_example
from sitegen.markup import code, display_math, esc, inline_math, link, markdown_math, table
from sitegen.uses import entries_used

SPEC_DIR = "spec"
ENTRY_CODE = re.compile(r"(?<![\[`])`([a-z][a-z0-9_]*)`(?!`)")
GROUP_TITLES = {
    "tokenizer": "Tokenizer",
    "embedding": "Embedding",
    "attention": "Attention",
    "block": "Block",
    "output": "Output",
    "loss": "Loss",
    "gradients": "Gradients",
    "optimizer": "Optimizer",
    "sampling": "Sampling",
    "costs": "Sizes and costs",
}
NOT_RUN = (
    "No conformance report was found when the site was built. Run "
    "<code>gptspec conformance --report out/conformance/&lt;backend&gt;.json</code> "
    "and rebuild."
)


# λ, wherever an entry page states a budget, links to where the Verification page defines it
LAMBDA_LINK = '<a class="gs-lambda" href="../verification/#budgets">λ</a>'


def lambda_links(budget_html: str, link: str = LAMBDA_LINK) -> str:
    """Every λ of a budget linked to the multiplier's definition; λ_wd (AdamW's weight
    decay) is another symbol and stays as it is."""
    return re.sub("λ(?!_)", link, budget_html)


class TraceabilityError(RuntimeError):
    """A spec entry without a reference function, a conformance check or a page."""


@dataclass(frozen=True)
class ReferenceCode:
    name: str
    path: str  # relative to the repository root
    line: int
    source: str
    url: str = ""  # the file at that line in the repository (mkdocs.yml's repo_url), if set


@dataclass(frozen=True)
class EntryView:
    """One entry with what the site links to it."""

    entry: Any  # gptspec.spec.Equation
    reference: ReferenceCode | None
    checks: tuple[CheckInfo, ...]
    example: Example | None = None  # run when the site was built
    uses: tuple[tuple[str, str], ...] = ()  # (id, title) of the entries its sympy form calls
    used_by: tuple[tuple[str, str], ...] = ()  # and of those whose sympy forms call it

    @property
    def page(self) -> str:
        return f"{SPEC_DIR}/{self.entry.id}.md"


def group_title(group: str) -> str:
    return GROUP_TITLES.get(group, group.capitalize())


def reference_code(module: ModuleType, name: str, root: Path, source_base: str = ""
                   ) -> ReferenceCode | None:
    function = getattr(module, name, None) if name else None
    if function is None or not callable(function):
        return None
    lines, line = inspect.getsourcelines(function)
    path = Path(inspect.getsourcefile(function) or "")
    try:
        shown = path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        shown = path.name
    url = f"{source_base}{shown}#L{line}" if source_base and shown != path.name else ""
    return ReferenceCode(name, shown, line, "".join(lines), url)


def _source_link(ref: ReferenceCode) -> str:
    where = f"{esc(ref.path)}, line {ref.line}"
    return f'<a href="{esc(ref.url)}">{where}</a>' if ref.url else where


def source_anchor(document: str) -> str:
    """The id of a cited document's section on the Sources page (its crosswalk)."""
    return "src-" + re.sub(r"[^a-z0-9]+", "-", document.lower()).strip("-")[:60].rstrip("-")


def _source_item(source: Any) -> str:
    """A citation, linked to where the Sources page lists everything cited in that document
    (the entry pages are spec/<id>/, the Sources page sources/)."""
    # a Markdown link, which MkDocs resolves (and checks) as it does any page's links
    title = re.sub(r"([\\\[\]*_`<])", r"\\\1", source.document)
    where = f", {esc(source.where)}" if source.where else ""
    return f"[{title}](../sources.md#{source_anchor(source.document)}){where}"


def sympy_definition(entry: Any) -> str:
    """The sympy function from its ``def`` on: the decorator's fields are shown above."""
    source = textwrap.dedent(entry.sympy_source)
    lines = source.splitlines()
    for i, text in enumerate(lines):
        if text.startswith("def "):
            return "\n".join(lines[i:])
    return source


def build_views(
    entries: Iterable[Any],
    reference_module: ModuleType,
    checks_for: Callable[[str], list[CheckInfo]],
    root: Path,
    source_base: str = "",
) -> list[EntryView]:
    """``source_base``: the URL that a path from the repository root is appended to for a
    link to the reference function's source ("" for none)."""
    entries = list(entries)
    titles = {e.id: e.title for e in entries}
    uses = {e.id: [u for u in entries_used(e) if u in titles] for e in entries}
    return [
        EntryView(e, reference_code(reference_module, e.reference, root, source_base),
                  tuple(checks_for(e.id)),
                  worked_example(e, reference_module),
                  tuple((u, titles[u]) for u in uses[e.id]),
                  tuple((o, titles[o]) for o in titles if e.id in uses[o]))
        for e in entries
    ]


def _uses(view: EntryView) -> str:
    """Links to the entries this one is built from and to those built from it (pages are
    siblings)."""
    lines = []
    for label, pairs in (("Uses", view.uses), ("Used by", view.used_by)):
        if pairs:
            lines.append(f'<p class="gs-uses" markdown><strong>{label}</strong> ' + ", ".join(
                f"[{esc(title)}]({entry_id}.md)" for entry_id, title in pairs) + "</p>\n")
    return "\n".join(lines)


def _example(example: Example | None) -> str:
    if example is None:
        return ""
    return ("## Worked example\n\n"
            "Small inputs through the reference function; the output below is what this code "
            "printed when the site was built (copy it and run it with gptspec installed).\n\n"
            f"```python\n{example.code}```\n\nOutput:\n\n```text\n{example.output}```\n")


# --- traceability ------------------------------------------------------------------------


def traceability_gaps(views: Sequence[EntryView], pages: set[str], checks_problem: str = ""
                      ) -> list[str]:
    """One line per empty cell of the matrix; empty when every entry is fully traced."""
    gaps = []
    if not views:
        gaps.append("the spec registry has no entries")
    for v in views:
        if v.reference is None:
            gaps.append(f"{v.entry.id}: no reference function "
                        f"gptspec.reference.{v.entry.reference or '?'}")
        if not v.checks:
            why = f" ({checks_problem})" if checks_problem else ""
            gaps.append(f"{v.entry.id}: no conformance check covers it{why}")
        if v.page not in pages:
            gaps.append(f"{v.entry.id}: no page {v.page}")
    return gaps


def traceability_page(views: Sequence[EntryView], pages: set[str]) -> str:
    missing = '<span class="gs-missing">missing</span>'
    rows = []
    for v in views:
        ref = code(f"{v.reference.name}") + f"<br><small>{esc(v.reference.path)}:" \
            f"{v.reference.line}</small>" if v.reference else missing
        checks = "<br>".join(code(c.id) + ("" if is_direct(v.entry.id, c) else
                                          " <small>(indirect)</small>")
                             for c in v.checks) or missing
        page = link(f"../{v.entry.id}/", v.entry.title) if v.page in pages else missing
        rows.append([code(v.entry.id), ref, checks, page])
    return (
        "# Traceability\n\n"
        "Every spec entry, the float64 reference function that transcribes it, the "
        "conformance checks that cover it, and its page. The site is not built if any "
        "cell is empty. A check marked *indirect* exercises the entry only inside a larger "
        "computation (see [Verification](verification.md)).\n\n"
        f"{len(views)} entries; {len({c.id for v in views for c in v.checks})} checks, "
        f"linked to entries {sum(len(v.checks) for v in views)} times (a check may cover "
        "several entries).\n\n"
        + table(["Equation", "Reference", "Checks", "Page"], rows, "gs-trace")
    )


# --- one entry ---------------------------------------------------------------------------


HANGING = 4  # how much further a wrapped line's continuation is indented than the line


def _python_html(source: str) -> str:
    """Highlighted Python whose long lines wrap with a hanging indent: each line is a
    block indented by its own leading spaces, its continuation HANGING columns further
    (wrapped at column 0, a continuation read as a dedent)."""
    formatter = HtmlFormatter(cssclass="language-python highlight", wrapcode=True,
                              linespans="gs-l")
    # a line is a block, so its newline would add an empty line after it
    out = re.sub(r'\n</span>(?=<span id="gs-l-|</code>)', "</span>",
                 highlight(source, PythonLexer(), formatter))
    starts = list(re.finditer(r'<span id="gs-l-\d+">', out))
    pieces, last = [], 0
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(out)
        text = html.unescape(re.sub(r"<[^>]+>", "", out[m.end():end]))
        indent = len(text) - len(text.lstrip(" "))
        pieces += [out[last:m.start()],
                   f'<span class="gs-line" style="padding-left: {indent + HANGING}ch; '
                   f'text-indent: -{indent + HANGING}ch">']
        last = m.end()
    return "".join(pieces) + out[last:]


def looks_like_latex(text: str) -> bool:
    """A decision's reading written as bare LaTeX (rather than words with $…$)."""
    return "\\" in text and "$" not in text


def _symbols_table(entry: Any) -> str:
    rows = [[inline_math(s.name), code(s.shape), esc(s.meaning)] for s in entry.symbols]
    if not rows:
        return "<p>No symbols.</p>\n"
    return table(["Symbol", "Shape", "Meaning"], rows, "gs-symbols")


def link_entries(text: str, ids: AbstractSet[str], self_id: str = "") -> str:
    """`id` in an entry's prose becomes a link to that entry's page (pages are siblings)."""
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in ids and name != self_id:
            return f"[`{name}`]({name}.md)"
        return match.group(0)

    return ENTRY_CODE.sub(replace, text)


def _decisions(entry: Any, ids: AbstractSet[str] = frozenset()) -> str:
    if not entry.decisions:
        return ""
    parts = ["## Where the documents disagree\n"]
    for d in entry.decisions:
        # A paragraph, not a heading: the table of contents would show its math untypeset.
        parts.append(f'<p class="gs-question" markdown>**{d.question}**</p>\n')
        for r in d.readings:
            reading = markdown_math(r.reading) if looks_like_latex(r.reading) else r.reading
            parts.append(f"- **{r.source}**: {reading}")
        parts.append(f"\n**Decision.** {link_entries(d.decision, ids, entry.id)}\n\n"
                     f"**Why.** {link_entries(d.why, ids, entry.id)}\n")
    return "\n".join(parts) + "\n"


def percent(fraction: float | None) -> str:
    """A check's worst error as a percentage of its budget (a pass is at most 100%)."""
    if fraction is None:
        return "—"
    return "∞" if fraction == float("inf") else f"{100 * fraction:.3g}%"


def _results(view: EntryView, reports: Sequence[BackendReport]) -> str:
    """The results of the reports that ran a check of this entry; nothing at all when none
    did (a report of another backend's subset, or no report, says nothing about it)."""
    covering = [(r, r.for_entry(view.entry.id)) for r in reports]
    covering = [(r, results) for r, results in covering if results]
    if not covering:
        return ""
    # One matrix: the entry's checks × the reports that ran them, each cell the status and
    # the worst error as a share of the budget; what produced each report in one footnote
    # (a block per report repeated the same rows up to six times).
    out = ["## Results of the built-in backends\n"]
    order: list[str] = []
    cells: dict[str, dict[int, str]] = {}
    notes = []
    for i, (_, results) in enumerate(covering):
        for r in results:
            if r.check_id not in cells:
                order.append(r.check_id)
                cells[r.check_id] = {}
            share = percent(r.budget_fraction)
            cells[r.check_id][i] = (f'<span class="gs-status gs-{esc(r.status)}">'
                                    f"{esc(r.status)}</span>"
                                    + (f" {share}" if share != "—" else ""))
            if r.message and r.status not in ("pass", "not-implemented"):  # the status says it
                notes.append(f"<li>{code(r.check_id)} in [{i + 1}]: {esc(r.message)}</li>")
    rows = [[code(check)] + [cells[check].get(i, "") for i in range(len(covering))]
            for check in order]
    # a column is headed by its footnote's number and its dtype ("name version · device ·
    # dtype"), the footnote naming the rest
    out.append(table(["Check"] + [f"[{i + 1}] {esc(report.backend.split('·')[-1].strip())}"
                                  for i, (report, _) in enumerate(covering)],
                     rows, "gs-results gs-matrix"))
    if notes:
        out.append("<ul><small>" + "".join(notes) + "</small></ul>\n")
    footnote = []
    for i, (report, _) in enumerate(covering):
        settings = f" ({esc(report.settings)})" if report.settings else ""
        produced = f"; produced by: {esc(report.provenance)}" if report.provenance else ""
        footnote.append(f"[{i + 1}] {esc(report.backend)}{settings}{produced}.")
    out.append('<p class="gs-provenance"><small>' + "<br>".join(footnote)
               + " A cell is the status and the worst error as a share of the budget; an "
               "empty one, a check that report did not run.</small></p>\n")
    return "\n".join(out)


def entry_page(view: EntryView, reports: Sequence[BackendReport],
               ids: AbstractSet[str] = frozenset()) -> str:
    """The page of one entry; ``ids`` are the entries its prose may link to."""
    e = view.entry
    ref = view.reference
    if ref is not None:
        reference = (f"<p><strong>Reference</strong> {code('gptspec.reference.' + ref.name)} "
                     f"<small>({_source_link(ref)})</small></p>\n"
                     + _python_html(ref.source))
    else:
        reference = '<p class="gs-missing">No reference function.</p>\n'
    # One column: the equation full width, its symbols, then the code (side by side, each
    # had half the width and long equations and code lines were cut off).
    parts = [
        f"# {e.title}\n",
        f'<p class="gs-meta">Entry {code(e.id)} · group '
        f'<a href="../#{esc(e.group)}">{esc(group_title(e.group))}</a></p>\n',
        '<div class="gs-equation">\n' + display_math(e.latex) + "\n</div>\n",
        _uses(view),
        "<p><strong>Symbols</strong></p>\n" + _symbols_table(e),
        reference,
        _example(view.example),
        "## Sources\n",
        "\n".join(f"- {_source_item(s)}" for s in e.sources) + "\n",
        _decisions(e, ids),
    ]
    if e.notes:
        parts += ["## Notes\n", link_entries(textwrap.dedent(e.notes).strip(), ids, e.id) + "\n"]
    parts += [
        "## Meaning (sympy)\n",
        "This function is the definition; the LaTeX above displays it. The tests "
        "evaluate it at high precision on random inputs and compare the reference "
        "function with it.\n",
        _python_html(sympy_definition(e)),
    ]
    if e.sympy_inputs:
        rows = [[code(n), code(s)] for n, s in e.sympy_inputs]
        parts.append(table(["Argument", "Shape"], rows))
    parts.append("## Tolerance\n")
    parts.append(_budget_section(e, view.checks))
    parts.append("## Conformance checks\n")
    if view.checks:
        normative = entry_budget(e.id, view.checks)
        parts.append(table(["Check", "Budget", "What it checks"],
                           [[code(c.id), _check_budget(c, normative), esc(c.description)]
                            for c in view.checks], "gs-checks"))
    else:
        parts.append('<p class="gs-missing">No conformance check covers this entry.</p>\n')
    parts.append(_results(view, reports))
    return "\n".join(parts) + "\n"


def own_checks(entry_id: str, checks: Sequence[CheckInfo]) -> list[CheckInfo]:
    """The checks that judge an entry on its own (their id begins ``<entry>.``) and state
    a budget."""
    return [c for c in checks if c.id.split(".")[0] == entry_id and c.budget]


def entry_budget(entry_id: str, checks: Sequence[CheckInfo]) -> CheckInfo | None:
    """The check whose budget is the entry's normative one: its first own check. The
    budget is the text the check registers beside the code that computes the numbers (and
    that every report carries), so the page cannot state a second budget for the entry."""
    own = own_checks(entry_id, checks)
    return own[0] if own else None


BUDGET_ABOVE = '<a href="#tolerance">the entry\'s budget</a>'


def _check_budget(check: CheckInfo, normative: CheckInfo | None) -> str:
    """A check's budget cell: the entry's own budget is stated once, in its Tolerance
    section, and a check that uses it points there."""
    if normative is not None and check.budget == normative.budget:
        return BUDGET_ABOVE
    return lambda_links(esc(check.budget)) or "—"


def _budget_section(e: Any, checks: Sequence[CheckInfo]) -> str:
    """One budget per entry: the one its own check computes, with the derivation; for an
    entry judged only inside larger computations, the spec's first-order model of it."""
    normative = entry_budget(e.id, checks)
    t = e.tolerance
    derivation = (f"<p><strong>Derivation.</strong> {lambda_links(esc(t.note))}</p>\n"
                  if t and t.note else "")
    if normative is not None:
        out = (f'<p class="gs-budget">A backend\'s result may differ from the float64 '
               f"reference by <strong>{lambda_links(esc(normative.budget))}</strong> "
               f"<small>(computed by {code(normative.id)})</small>.</p>\n" + derivation)
        text = normative.budget
    elif t is not None:
        out = (f'<p class="gs-budget">A backend\'s result may differ from the float64 '
               f"reference by {inline_math(t.formula)}, the reduction length being "
               f"{code(t.reduction)}.</p>\n" + derivation
               + "<p><small>No check judges this entry on its own: the checks below judge "
               "it inside larger computations, each against its own budget.</small></p>\n")
        text = t.formula
    else:
        return "No tolerance: the result is compared exactly.\n"
    if "λ" in text or "\\lambda" in text:
        out += (f"<p><small>{LAMBDA_LINK} is the suite's budget multiplier (defined on the "
                "Verification page); u is the unit roundoff of the dtype, ⊕ adds two "
                "independent errors in quadrature.</small></p>\n")
    return out


# --- index and results pages -------------------------------------------------------------


def index_page(views: Sequence[EntryView], groups: Sequence[str]) -> str:
    parts = [
        "# The specification\n",
        f"{len(views)} equations, grouped as the model computes them. Each page shows the "
        "equation, its symbols and shapes, its sources, where the documents disagree, the "
        "reference function beside it, and the conformance checks that cover it. See also "
        "the [traceability matrix](traceability.md) and the "
        "[conformance results](conformance.md).\n",
    ]
    for group in groups:
        members = [v for v in views if v.entry.group == group]
        parts.append(f'## {group_title(group)} {{ #{group} }}\n')
        if not members:
            parts.append("No entries yet.\n")
            continue
        rows = [[link(f"{v.entry.id}/", v.entry.title), inline_math(v.entry.latex),
                 code(v.entry.reference)] for v in members]
        parts.append(table(["Entry", "Equation", "Reference"], rows, "gs-index"))
    return "\n".join(parts) + "\n"


def conformance_page(reports: Sequence[BackendReport],
                     suite_ids: AbstractSet[str] | None = None, head: str = "",
                     root: Path | None = None, areas: Mapping[str, str] | None = None) -> str:
    """``suite_ids``: the suite's checks, which each report is compared with (None: not
    compared; a report of one area (--area) with that area's checks, by ``areas``: check
    id → area); ``head``: the commit the site is built from, ``root`` the checkout."""
    parts = ["# Conformance results\n",
             "The latest results of the built-in backends, read from the JSON reports of "
             "`gptspec conformance --report FILE` when the site was built.\n"]
    if not reports:
        parts.append(f'<p class="gs-not-run">{NOT_RUN}</p>\n')
    else:
        parts.append(summary_matrix(reports))
    for report in reports:
        parts.append(f"## {esc(report.backend)}\n")
        if suite_ids is not None:
            expected, what = suite_ids, f"This report ({report.path.name})"
            if report.area and areas:  # the checks it was asked for, not those of every area
                expected = {i for i in suite_ids if areas.get(i) in (report.area, "", None)}
                what = f"This report ({report.path.name}, area {report.area})"
            parts.append(stale_banner(what, (r.check_id for r in report.results), expected,
                                      report.commit, head, root))
        if report.settings:
            parts.append(f"Settings: {esc(report.settings)}.\n")
        if report.provenance:
            parts.append(f"Produced by: {esc(report.provenance)}.\n")
        rows = [[code(r.check_id), esc(", ".join(r.entries)),
                 f'<span class="gs-status gs-{esc(r.status)}">{esc(r.status)}</span>',
                 percent(r.budget_fraction)] for r in report.results]
        counts = _counts(report.results)
        parts.append(f"<details><summary>Every check of this report, with its spec entries "
                     f"({esc(counts)})</summary>\n\n"
                     + table(["Check", "Spec entry", "Status", "Worst error / budget"], rows,
                             "gs-results") + "\n</details>\n")
    parts.append(drawn.section())
    return "\n".join(parts) + "\n"


def _counts(results: Sequence[Any]) -> str:
    """'66 pass, 5 not implemented': a report's statuses, most frequent first."""
    tally: dict[str, int] = {}
    for r in results:
        tally[r.status] = tally.get(r.status, 0) + 1
    return ", ".join(f"{n} {status}" for status, n in
                     sorted(tally.items(), key=lambda kv: (-kv[1], kv[0])))


MATRIX_WORDS = {"not-implemented": "n/i", "not-applicable": "n/a"}
MATRIX_LEGEND = ("A cell is the check's status — pass, fail, error, blocked (a check it "
                 "depends on failed), n/i (not implemented), n/a (not applicable) — "
                 "and its worst error as a share of its budget where it compared anything; "
                 "an empty cell, a check not in that report.")


def status_matrix(columns: Sequence[str],
                  runs: Sequence[Sequence[tuple[str, str, float | None]]],
                  marks: Mapping[str, str] | None = None) -> str:
    """Checks × runs, shared by the Conformance results and Compatibility summaries:
    ``columns`` the runs' headings (HTML), ``runs`` each one's (check id, status, worst
    fraction) in its order; a row per check in first-seen order, each cell the status
    (``marks`` may append a sign to a status, as Compatibility's † on an adjudicated
    failure) and the share of the budget, empty where the run has no such check."""
    order: dict[str, dict[int, str]] = {}
    for i, results in enumerate(runs):
        for check_id, status, fraction in results:
            share = percent(fraction)
            order.setdefault(check_id, {})[i] = (
                f'<span class="gs-status gs-{esc(status)}">'
                f"{esc(MATRIX_WORDS.get(status, status))}{(marks or {}).get(status, '')}"
                "</span>" + (f" {share}" if share != "—" else ""))
    rows = [[code(check)] + [cells.get(i, "") for i in range(len(runs))]
            for check, cells in order.items()]
    return table(["Check", *columns], rows, "gs-results gs-matrix")


def summary_matrix(reports: Sequence[BackendReport]) -> str:
    """Checks × reports on one screen-width table (:func:`status_matrix`). The reports'
    own sections below give the provenance and the spec entries."""
    totals = "; ".join(f"{esc(r.backend)}: {esc(_counts(r.results))}" for r in reports)
    matrix = status_matrix([esc(r.backend) for r in reports],
                           [[(r.check_id, r.status, r.budget_fraction) for r in report.results]
                            for report in reports])
    return ("## Summary\n\n" + f"<p>{totals}.</p>\n" + matrix
            + f"\n<p><small>{esc(MATRIX_LEGEND)} Each report's section below says what "
              "produced it.</small></p>\n")


def presets_table(presets: dict[str, Any], parameter_count: Callable[[Any], int]) -> str:
    """The named configurations, with their parameter counts."""
    norms = {"pre": "pre-LN", "post": "post-LN", "guide": "one residual"}

    def biases(c: Any) -> str:
        kinds = [what for what, on in (("Q/K/V, O", c.attn_bias), ("FFN", c.ffn_bias)) if on]
        return esc(" + ".join(kinds) if kinds else "none")

    def head_width(c: Any) -> str:  # a free width is marked: h·d_k ≠ d
        return str(c.d_head) if c.head_width_is_derived else f"<b>{c.d_head}</b> (free)"

    # the parameter count second: it is what a reader compares first, and in the last
    # column it sat behind the table's scroll bar at 1400 px
    rows = [[code(name), f"{parameter_count(c):,}", str(c.vocab_size), str(c.n_ctx),
             str(c.d_model), str(c.n_layers),
             str(c.n_heads), head_width(c), str(c.d_ff), norms.get(c.norm, esc(c.norm)),
             code(c.ffn), biases(c), "learned" if c.positional_embedding else "none",
             ("tied" if c.tied_embeddings else "untied") + (" + bias" if c.output_bias else "")]
            for name, c in presets.items()]
    header = ["preset", "parameters", inline_math("V"), inline_math(r"n_{\text{ctx}}"), inline_math("d"),
              inline_math("L"), inline_math("h"), inline_math("d_k"), inline_math(r"d_{\text{ff}}"),
              "block", "FFN", "biases", "positions", "output"]
    return table(header, rows)


def gpt3_counts_table(gpt3_table: dict[str, Any], parameter_count: Callable[[Any], int]) -> str:
    """GPT-3's Table 2.1: each preset's parameter count against the published one."""
    def figure(n: int) -> str:  # as the table prints them: 125M … 1.3B … 175.0B
        return f"{n / 1e6:g}M" if n < 10**9 else f"{n / 1e9:g}B"

    rows = [[code(name), f"{parameter_count(c):,}", figure(published),
             f"{parameter_count(c) / published:.3f}"]
            for name, (c, published) in gpt3_table.items()]
    return table(["preset", "our count", "published (Table 2.1)", "ratio"], rows)


def preset_decisions(decisions: dict[str, Any]) -> str:
    """Where a preset cannot simply copy its document: each reading and the choice."""
    parts = []
    for d in decisions.values():
        parts.append(f'<p class="gs-question" markdown>**{esc(d.question)}**</p>\n')
        parts += [f"- **{esc(r.source)}**: {esc(r.reading)}" for r in d.readings]
        parts.append(f"\n**Decision.** {d.decision}\n\n**Why.** {d.why}\n")
    return "\n".join(parts) + "\n"


def reference_line(ref: Any) -> str:
    """Who wrote a cited document, when and where, linked where the project knows the
    address; a missing reference is an error, so every citation can be looked up."""
    if ref is None:
        raise TraceabilityError("a cited document has no entry in gptspec.spec.sources."
                                "REFERENCES")
    venue = f" {esc(ref.venue)}." if ref.venue else ""
    where = (f' <a href="{esc(ref.url)}">{esc(ref.url)}</a>' if ref.url
             else " No address recorded.")
    return (f'<p class="gs-reference"><strong>Authors:</strong> {esc(ref.authors)}. '
            f"<strong>Date:</strong> {esc(ref.date)}.{venue}{where}</p>\n")


def crosswalk(entries: Iterable[Any], spec_dir: str) -> str:
    """For each cited document, each place cited in it and the entries that cite it, the
    four source documents first (in the order of gptspec.spec.sources), then the papers."""
    from gptspec.spec import sources

    cited: dict[str, dict[str, list[Any]]] = {}
    for e in entries:
        for s in e.sources:
            cited.setdefault(s.document, {}).setdefault(s.where or "(whole)", []).append(e)
    first = [sources.NOTES, sources.GUIDE, sources.BLUEPRINT, sources.POST]
    order = [d for d in first if d in cited] + sorted(d for d in cited if d not in first)
    parts = []
    for document in order:
        parts.append(f"### {esc(document)} {{ #{source_anchor(document)} }}\n")
        parts.append(reference_line(sources.REFERENCES.get(document)))
        rows = [[esc(where), ", ".join(link(f"{spec_dir}/{e.id}/", e.title) for e in es)]
                for where, es in sorted(cited[document].items(), key=lambda kv: _natural(kv[0]))]
        parts.append(table(["Where", "Specified by"], rows, "gs-crosswalk"))
    return "\n".join(parts) + "\n"


def _natural(text: str) -> list[Any]:
    """'eq 10' after 'eq 9'."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]


# --- writing -------------------------------------------------------------------------------


def write_if_changed(path: Path, text: str | bytes) -> None:
    """Write only when the content differs, so that `mkdocs serve` (which watches the docs
    folder) is not woken by its own output."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    if path.exists() and path.read_bytes() == data:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def render_pages(views: Sequence[EntryView], groups: Sequence[str],
                 reports: Sequence[BackendReport], head: str = "", root: Path | None = None
                 ) -> dict[str, str]:
    """Every generated page by its path under the site's docs root; ``head`` and ``root``
    as for :func:`conformance_page`."""
    ids = {v.entry.id for v in views}
    pages = {v.page: entry_page(v, reports, ids) for v in views}
    pages[f"{SPEC_DIR}/index.md"] = index_page(views, groups)
    # every check covers an entry, so the views hold the suite's checks
    pages[f"{SPEC_DIR}/conformance.md"] = conformance_page(
        reports, {c.id for v in views for c in v.checks}, head, root,
        {c.id: c.area for v in views for c in v.checks})
    pages[f"{SPEC_DIR}/traceability.md"] = traceability_page(views, set(pages))
    return pages


def spec_nav(views: Sequence[EntryView], groups: Sequence[str]) -> list[Any]:
    nav: list[Any] = [{"Index": f"{SPEC_DIR}/index.md"}]
    for group in groups:
        members = [{v.entry.title: v.page} for v in views if v.entry.group == group]
        if members:
            nav.append({group_title(group): members})
    nav += [{"Traceability": f"{SPEC_DIR}/traceability.md"},
            {"Conformance results": f"{SPEC_DIR}/conformance.md"}]
    return nav
