"""MkDocs hooks: generate the spec pages, figures and diagram, and ship KaTeX.

Registered in mkdocs.yml (``hooks: [docs/hooks.py]``). At each build:

- ``on_config`` reads ``gptspec.spec.REGISTRY``, writes a page per entry, the index by
  group, the traceability matrix, the conformance results and the Open questions page
  (from the committed results in ``docs/experiments/``) into ``docs/generated/``,
  adds them to the navigation, and fails the build if the matrix has an empty cell;
  it also makes the figures (a tiny model trained for a few seconds) and installs KaTeX;
- ``on_files`` adds the generated files and KaTeX's ``dist`` to the site (``docs/generated``
  is excluded from the ordinary file scan so its pages get URLs like ``/spec/softmax/``);
- ``on_page_markdown`` inlines the data-flow diagram where a page asks for it, and the
  numbers the guides state from saved runs (the NumPy example's conformance run, the
  mutation catalog's), so that no count is typed by hand;
- ``on_post_build`` turns the TeX in the search index into plain text (readable snippets).
"""

from __future__ import annotations

import logging
import posixpath
import re
import sys
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

DOCS = Path(__file__).resolve().parent
# mkdocs loads this file by path: sitegen/ beside it, and meta/ (the mutation catalog the
# Verification page lists, never installed) at the repository root, are found from here
for folder in (DOCS, DOCS.parent):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

from sitegen import (  # noqa: E402
    backend_guide,
    compatibility,
    dataflow,
    evidence,
    example_run,
    figures,
    katex,
    markup,
    open_questions,
    search_text,
    spec_pages,
    verification,
)
from sitegen.checks import load_checks_for  # noqa: E402
from sitegen.conformance_results import ReportError, load_reports  # noqa: E402

log = logging.getLogger("mkdocs.hooks.gptspec")
GENERATED = DOCS / "generated"
KATEX_FILES = ("katex.min.js", "katex.min.css", "contrib/auto-render.min.js")
DIAGRAM_MARKER = "<!-- gptspec:dataflow -->"
PRESETS_MARKER = "<!-- gptspec:presets -->"
GPT3_COUNTS_MARKER = "<!-- gptspec:gpt3-counts -->"
PRESET_DECISIONS_MARKER = "<!-- gptspec:preset-decisions -->"
FIGURE_NOTE_MARKER = "<!-- gptspec:figure-note -->"
CROSSWALK_MARKER = "<!-- gptspec:crosswalk -->"
EXAMPLE_RUN_MARKER = "<!-- gptspec:numpy-example-run -->"
MUTATION_SUMMARY_MARKER = "<!-- gptspec:mutation-summary -->"
CONFIG_FIELDS_MARKER = "<!-- gptspec:config-fields -->"
SCHEMA_SHAPES_MARKER = "<!-- gptspec:schema-shapes -->"
SPEC_LINK = re.compile(r"\[([^\]]*)\]\(spec:([A-Za-z0-9_]+)\)")

VERIFICATION_PAGE = f"{spec_pages.SPEC_DIR}/verification.md"
COMPATIBILITY_PAGE = f"{spec_pages.SPEC_DIR}/compatibility.md"
OPEN_QUESTIONS_PAGE = open_questions.PAGE  # in mkdocs.yml's nav

_state: dict[str, Any] = {}


def _verification_page(views: list[Any], root: Path) -> str:
    """What is verified and how: the budgets, every check, the mutation catalog (with the
    killing checks of a saved catalog run, docs/mutation-results.json, where there is one)."""
    from gptspec.conformance import budgets
    from gptspec.conformance.registry import all_checks
    from meta.mutants import MUTANTS
    from meta.soundness import gate

    try:
        run = verification.load_mutation_results(root / verification.MUTATION_RESULTS)
        keyhole = verification.load_keyhole_results(root / verification.KEYHOLE_RESULTS)
        cuda = verification.load_cuda_results(root / verification.CUDA_RESULTS)
        ledger = verification.load_soundness_ledger(root / verification.SOUNDNESS_LEDGER)
    except verification.MutationResultsError as err:
        raise PluginError(str(err)) from None
    current = gate.current_runs(ledger) if ledger is not None else []
    summary = gate.ledger_summary(root / verification.SOUNDNESS_LEDGER)[0] \
        if ledger is not None else ""
    return verification.verification_page(
        views, all_checks(), MUTANTS, run, budgets, keyhole=keyhole, cuda=cuda,
        soundness=verification.soundness_section(ledger, current, summary))


def _compatibility_page(root: Path) -> str:
    """The ecosystem's engines × dtypes × areas, from docs/ecosystem/*.json; a failure with
    no adjudication in docs/ecosystem/adjudications.toml fails the build."""
    from gptspec.adapters import ecosystem
    from gptspec.conformance.registry import all_checks

    try:
        runs = compatibility.load_runs(root / ecosystem.REPORT_DIR)
        table = ecosystem.load_adjudications(root / ecosystem.ADJUDICATIONS)
        return compatibility.compatibility_page(runs, ecosystem.ENGINES, table,
                                                ecosystem.VERDICTS,
                                                {c.id: c.area for c in all_checks()},
                                                evidence.build_commit(root), root)
    except (compatibility.CompatibilityError, ecosystem.AdjudicationError) as err:
        raise PluginError(str(err)) from None


def _open_questions(root: Path, pages: dict[str, str]) -> None:
    """The Open questions page, from the committed results in docs/experiments/ (quick-mode
    results, or figures that are not the ones drawn from the results, fail the build), and
    a paragraph on the page of each entry a question concerns."""
    from gptspec.experiments.studies import FULL, STUDY_NAMES, design

    studies = {name: design(name, FULL) for name in STUDY_NAMES}
    try:
        results = open_questions.load_results(root / open_questions.RESULTS, STUDY_NAMES)
    except open_questions.OpenQuestionsError as err:
        raise PluginError(str(err)) from None
    pages[OPEN_QUESTIONS_PAGE] = open_questions.page(results, studies)
    for entry_id in sorted({i for ids in open_questions.ENTRIES.values() for i in ids}):
        path = f"{spec_pages.SPEC_DIR}/{entry_id}.md"
        if path not in pages:
            raise PluginError(f"the Open questions page links the entry {entry_id!r}, which "
                              "has no page")
        pages[path] += "\n" + open_questions.entry_note(entry_id, results, studies)


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    root = Path(config.config_file_path).resolve().parent
    import gptspec.reference
    from gptspec.spec import GROUPS, REGISTRY

    checks_for, checks_problem = load_checks_for()
    # the reference functions' source links: repo_url (a placeholder, see mkdocs.yml), at
    # the commit the site is built from, so a line number stays right after later commits
    ref = evidence.build_commit(root) or evidence.FALLBACK_REF
    source_base = f"{config.repo_url.rstrip('/')}/blob/{ref}/" if config.repo_url else ""
    views = spec_pages.build_views(REGISTRY, gptspec.reference, checks_for, root, source_base)
    planned = set(spec_pages.render_pages(views, GROUPS, []))
    gaps = spec_pages.traceability_gaps(views, planned, checks_problem)
    if gaps:
        raise PluginError("traceability matrix has empty cells:\n  " + "\n  ".join(gaps))
    try:
        reports = load_reports(root)
    except ReportError as err:
        raise PluginError(str(err)) from None
    pages = spec_pages.render_pages(views, GROUPS, reports, evidence.build_commit(root), root)
    pages[VERIFICATION_PAGE] = _verification_page(views, root)
    pages[COMPATIBILITY_PAGE] = _compatibility_page(root)
    _open_questions(root, pages)
    for path, text in pages.items():
        spec_pages.write_if_changed(GENERATED / path, text)
    for stale in (GENERATED / spec_pages.SPEC_DIR).glob("*.md"):  # entries renamed or removed
        if f"{spec_pages.SPEC_DIR}/{stale.name}" not in pages:
            stale.unlink()
    if not reports:
        log.info("no conformance report found: entry pages show no results")

    try:
        stats = figures.make_figures(GENERATED / "assets" / "figures", root / ".cache" / "figures")
        package = katex.ensure_katex(root)
    except (figures.FigureError, katex.KatexError) as err:
        raise PluginError(str(err)) from None

    _state.update(package=package, entry_ids={v.entry.id for v in views}, figure_stats=stats)
    nav = list(config.nav or [])
    nav.append({"Specification": spec_pages.spec_nav(views, GROUPS)
                + [{"Verification": VERIFICATION_PAGE}, {"Compatibility": COMPATIBILITY_PAGE}]})
    config.nav = nav
    return config


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for path in sorted(p for p in GENERATED.rglob("*") if p.is_file()):
        if path.name.endswith(".tmp"):
            continue
        files.append(File.generated(config, path.relative_to(GENERATED).as_posix(),
                                    abs_src_path=str(path)))
    dist = _state["package"] / "dist"
    wanted = [dist / f for f in KATEX_FILES] + sorted((dist / "fonts").glob("*.woff2"))
    for path in wanted:
        files.append(File.generated(config, "assets/katex/" + path.relative_to(dist).as_posix(),
                                    abs_src_path=str(path)))
    return files


def on_post_build(config: MkDocsConfig) -> None:
    """Search snippets in plain text: the index's TeX becomes a reading of it (the search
    plugin, which runs before the hooks, has written the index by now)."""
    index = Path(config.site_dir) / "search" / "search_index.json"
    if index.exists():
        search_text.rewrite_index(index)
    # Saved data published as is (the experiments' results) names the machine that made
    # it: a study's text source is "the standard library (/root/.pyenv/…)". Its paths are
    # cut as on the pages, so no file of the site names a machine.
    for path in Path(config.site_dir).rglob("*"):
        if path.suffix in (".json", ".svg", ".txt", ".xml") and path.is_file():
            text = path.read_text(encoding="utf-8")
            public = markup.public_text(text)
            if public != text:
                path.write_text(public, encoding="utf-8")


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    markdown = _spec_links(markdown, page)
    if PRESETS_MARKER in markdown:
        from gptspec.spec import PRESETS, parameter_count

        markdown = markdown.replace(PRESETS_MARKER,
                                    spec_pages.presets_table(PRESETS, parameter_count))
    if GPT3_COUNTS_MARKER in markdown:
        from gptspec.spec import parameter_count
        from gptspec.spec.config import GPT3_TABLE

        markdown = markdown.replace(GPT3_COUNTS_MARKER,
                                    spec_pages.gpt3_counts_table(GPT3_TABLE, parameter_count))
    if PRESET_DECISIONS_MARKER in markdown:
        from gptspec.spec.config import PRESET_DECISIONS

        markdown = markdown.replace(PRESET_DECISIONS_MARKER,
                                    spec_pages.preset_decisions(PRESET_DECISIONS))
    if CROSSWALK_MARKER in markdown:
        from gptspec.spec import REGISTRY

        # the page's URL is one folder deep (sources/), the spec pages' are spec/<id>/
        markdown = markdown.replace(CROSSWALK_MARKER, spec_pages.crosswalk(
            REGISTRY, "../" + spec_pages.SPEC_DIR))
    if EXAMPLE_RUN_MARKER in markdown:
        from gptspec.conformance.registry import all_checks

        root = Path(config.config_file_path).resolve().parent
        try:
            run = example_run.section(root, [c.id for c in all_checks()],
                                      evidence.build_commit(root))
        except example_run.ExampleRunError as err:
            raise PluginError(str(err)) from None
        markdown = markdown.replace(EXAMPLE_RUN_MARKER, run)
    if MUTATION_SUMMARY_MARKER in markdown:
        from meta.mutants import MUTANTS

        root = Path(config.config_file_path).resolve().parent
        try:
            saved = verification.load_mutation_results(root / verification.MUTATION_RESULTS)
        except verification.MutationResultsError as err:
            raise PluginError(str(err)) from None
        markdown = markdown.replace(MUTATION_SUMMARY_MARKER,
                                    verification.mutation_summary(MUTANTS, saved))
    # the backend guide's tables of what forward receives, from GPTConfig and the schema
    markdown = markdown.replace(CONFIG_FIELDS_MARKER, backend_guide.config_fields())
    markdown = markdown.replace(SCHEMA_SHAPES_MARKER, backend_guide.schema_shapes())
    if FIGURE_NOTE_MARKER in markdown:
        s = _state["figure_stats"]
        note = (f"The model below was trained with {s['model']} for {s['steps']} steps "
                f"({s['train_seconds']:.0f} s on the machine that built this site); its final "
                f"validation loss was {s['final_val_bits']:.2f} bits per byte.")
        markdown = markdown.replace(FIGURE_NOTE_MARKER, note)
    if DIAGRAM_MARKER not in markdown:
        return markdown

    def href(entry_id: str) -> str | None:
        target = files.get_file_from_path(f"{spec_pages.SPEC_DIR}/{entry_id}.md")
        return target.url_relative_to(page.file) if target else None

    return markdown.replace(DIAGRAM_MARKER, dataflow.svg(href))


def _spec_links(markdown: str, page: Page) -> str:
    """``[text](spec:ID)`` → a link to that entry's page; an unknown ID is a warning (and so
    fails a --strict build), so the guides cannot point at an entry that was renamed."""
    here = posixpath.dirname(page.file.src_uri)

    def replace(match: re.Match[str]) -> str:
        text, entry_id = match.groups()
        if entry_id not in _state["entry_ids"]:
            log.warning(f"{page.file.src_uri}: link to unknown spec entry {entry_id!r}")
            return text
        target = f"{spec_pages.SPEC_DIR}/{entry_id}.md"
        return f"[{text}](" + posixpath.relpath(target, here or ".") + ")"

    return SPEC_LINK.sub(replace, markdown)
