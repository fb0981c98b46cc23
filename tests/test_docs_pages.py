"""The page generator of the spec site (docs/sitegen), on entries made here for the test."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))

from sitegen import spec_pages  # noqa: E402
from sitegen.checks import CheckInfo  # noqa: E402
from sitegen.conformance_results import ReportError, load_report  # noqa: E402

from gptspec.spec.equation import Decision, Equation, Reading, Symbol, Tolerance  # noqa: E402
from gptspec.spec.sources import BLUEPRINT, GUIDE, Source  # noqa: E402


def _scale(x):
    return 2 * x


def made_up_entry(entry_id: str = "scale", reference: str = "scale") -> Equation:
    # Built directly, not through @equation, so the project's registry is untouched.
    return Equation(
        id=entry_id, title="Scale by two", group="attention",
        latex=r"y = 2\,x \quad \lvert x \rvert < 1",
        symbols=(Symbol(r"|x|", "(n,)", "a <b>row</b> & more"),),
        sources=(Source(BLUEPRINT, "eq 99"),),
        sympy=_scale, reference=reference,
        tolerance=Tolerance(r"\sqrt{n}\,u", reduction="n", note="one rounding"),
        decisions=(Decision("Two or three?", (Reading(Source(BLUEPRINT, "eq 99"), r"y = 2\,x"),
                                              Reading(Source(GUIDE, "sec 1"), "three times x")),
                            "two", "the Blueprint is explicit"),),
        notes="Doubling is exact in binary floating point.",
    )


def reference_module() -> types.ModuleType:
    module = types.ModuleType("fake_reference")

    def scale(x):
        """y = 2 x."""
        return 2 * x

    module.scale = scale  # type: ignore[attr-defined]
    return module


def checks(entry_id: str) -> list[CheckInfo]:
    return [CheckInfo(f"{entry_id}.differential", r"\sqrt{n}\,u of float32", "against float64")]


def views(entry: Equation, checks_for=checks) -> list[spec_pages.EntryView]:
    return spec_pages.build_views([entry], reference_module(), checks_for, ROOT)


def test_an_entry_page_shows_everything_about_the_entry() -> None:
    page = spec_pages.entry_page(views(made_up_entry())[0], reports=[])
    assert page.startswith("# Scale by two\n")
    assert r'<div class="arithmatex">\[y = 2\,x \quad \lvert x \rvert &lt; 1\]</div>' in page
    assert r'<span class="arithmatex">\(|x|\)</span>' in page  # a | does not split the table
    assert "a &lt;b&gt;row&lt;/b&gt; &amp; more" in page  # meanings are escaped
    assert "y = 2 x." in page  # the reference function's source, beside the equation
    assert '<span class="nf">_scale</span>' in page  # the sympy definition
    assert BLUEPRINT in page and "eq 99" in page
    assert "Two or three?" in page and r"\(y = 2\,x\)" in page and "three times x" in page
    assert "<code>scale.differential</code>" in page
    # no report: no results section, and no "Not yet run" claim about this entry
    assert "Results of the built-in backends" not in page and "Not yet run" not in page
    assert "Doubling is exact" in page


def test_entry_ids_in_prose_link_to_their_pages() -> None:
    text = "see `scale` and `other`, not `unknown` or ``scale``; `self` stays"
    linked = spec_pages.link_entries(text, {"scale", "other", "self"}, self_id="self")
    assert linked == ("see [`scale`](scale.md) and [`other`](other.md), not `unknown` or "
                      "``scale``; `self` stays")


def test_reports_are_shown_on_the_page_of_the_entry_they_check(tmp_path: Path) -> None:
    report = tmp_path / "torch.json"
    report.write_text(json.dumps({"schema": "gptspec-conformance", "version": 2, "runs": [{
        "backend": {"name": "torch", "version": "2.13.0", "device": "cpu", "dtype": "float32"},
        "settings": {"profile": "quick", "seed": 0},
        "checks": [{"id": "scale.differential", "entries": ["scale"], "status": "pass",
                    "worst_fraction": 0.25},
                   {"id": "other.thing", "entries": ["other"], "status": "fail",
                    "worst_fraction": 7.0}]}]}))
    page = spec_pages.entry_page(views(made_up_entry())[0], load_report(report))
    assert "torch 2.13.0 · cpu · float32" in page and "profile quick" in page
    assert "<code>scale.differential</code>" in page and "25%" in page and "pass" in page
    assert "other.thing" not in page and "Not yet run" not in page


def test_results_say_which_commit_date_machine_profile_device_and_dtype_produced_them(
        tmp_path: Path) -> None:
    run = {"backend": {"name": "torch", "version": "2.13.0", "device": "cpu",
                       "dtype": "bfloat16"},
           "settings": {"profile": "quick", "seed": 0},
           "checks": [{"id": "scale.differential", "entries": ["scale"], "status": "pass",
                       "worst_fraction": 0.5}]}
    report = tmp_path / "torch.json"
    report.write_text(json.dumps({
        "schema": "gptspec-conformance", "version": 3, "runs": [run],
        "provenance": {"commit": "0123456789abcdef", "modified": True,
                       "date": "2025-01-31 14:05 UTC", "machine": "Linux-x86_64",
                       "cpu": "Some CPU", "python": "3.11.7"}}))
    page = spec_pages.entry_page(views(made_up_entry())[0], load_report(report))
    assert ("commit 0123456789 with local changes; 2025-01-31 14:05 UTC; Linux-x86_64, "
            "Some CPU; profile quick; device cpu; dtype bfloat16") in page
    old = tmp_path / "old.json"  # a version 2 report has no provenance: said, not invented
    old.write_text(json.dumps({"schema": "gptspec-conformance", "version": 2, "runs": [run]}))
    page = spec_pages.conformance_page(load_report(old))
    assert "commit not recorded; date not recorded; machine not recorded" in page


HEAD = '{"schema": "gptspec-conformance", "version": 1, '


@pytest.mark.parametrize("content", [
    "{not json", "[1, 2]", '{"schema": "other", "version": 1, "runs": []}',
    '{"schema": "gptspec-conformance", "version": 99, "runs": []}',
    HEAD + '"runs": [{"checks": [{"status": "pass"}]}]}',
    HEAD + '"runs": [{"checks": [{"id": "a", "entries": ["a"], "worst_fraction": "big"}]}]}',
    HEAD + '"runs": [{"backend": {}}]}'])
def test_a_corrupt_report_is_an_error_naming_the_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ReportError, match="bad.json"):
        load_report(path)


def test_the_traceability_matrix_names_every_empty_cell() -> None:
    full = views(made_up_entry())
    pages = set(spec_pages.render_pages(full, ["attention"], []))
    assert spec_pages.traceability_gaps(full, pages) == []
    no_ref = views(made_up_entry(reference="nowhere"))
    assert spec_pages.traceability_gaps(no_ref, pages) == [
        "scale: no reference function gptspec.reference.nowhere"]
    no_checks = views(made_up_entry(), checks_for=lambda entry_id: [])
    assert spec_pages.traceability_gaps(no_checks, pages, "registry missing") == [
        "scale: no conformance check covers it (registry missing)"]
    assert spec_pages.traceability_gaps(full, set()) == ["scale: no page spec/scale.md"]
    assert spec_pages.traceability_gaps([], set()) == ["the spec registry has no entries"]


def test_the_index_groups_entries_and_links_their_pages() -> None:
    pages = spec_pages.render_pages(views(made_up_entry()), ["embedding", "attention"], [])
    index = pages["spec/index.md"]
    assert "## Attention { #attention }" in index
    assert '<a href="scale/">Scale by two</a>' in index
    assert index.index("## Embedding") < index.index("No entries yet.") < index.index(
        "## Attention")
    nav = spec_pages.spec_nav(views(made_up_entry()), ["embedding", "attention"])
    assert {"Attention": [{"Scale by two": "spec/scale.md"}]} in nav


def test_the_site_build_fails_on_an_entry_without_a_check(tmp_path: Path) -> None:
    """A planted entry whose reference exists but that no check covers stops the build."""
    script = textwrap.dedent(f"""
        import logging
        import sys
        from mkdocs.commands.build import build
        from mkdocs.config import load_config
        from mkdocs.exceptions import Abort
        from gptspec.spec.equation import equation
        from gptspec.spec.sources import BLUEPRINT, Source

        @equation(id="planted_untested", title="Planted", group="output", latex="x",
                  symbols=(), sources=(Source(BLUEPRINT),), reference="softmax")
        def planted_untested(x):
            return x

        config = load_config({str(ROOT / "mkdocs.yml")!r}, site_dir={str(tmp_path / "site")!r})
        logging.basicConfig(stream=sys.stdout, level=logging.ERROR)  # mkdocs logs the cause
        try:
            build(config)
        except Abort:
            sys.exit(3)
    """)
    (tmp_path / "plant.py").write_text(script)  # a file: inspect reads the sympy source
    done = subprocess.run([sys.executable, str(tmp_path / "plant.py")], cwd=ROOT,
                          capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 3, (done.stdout + done.stderr)[-2000:]
    assert "planted_untested: no conformance check covers it" in done.stdout
    assert not (tmp_path / "site" / "index.html").exists()


def test_the_diagram_is_valid_svg_linking_only_existing_pages() -> None:
    import xml.etree.ElementTree as ET

    from sitegen import dataflow

    known = {"one_hot": "../spec/one_hot/", "softmax": "../spec/softmax/"}
    markup = dataflow.svg(known.get)
    svg = ET.fromstring(markup).find("{http://www.w3.org/2000/svg}svg")
    assert svg is not None
    links = [a.get("href") for a in svg.iter("{http://www.w3.org/2000/svg}a")]
    assert links == ["../spec/one_hot/", "../spec/softmax/"]  # the others have no page here
    labels = {t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")}
    assert {"text", "tokenizer", "causal multi-head attention", "next-token distribution"} <= labels
    # the view is the drawing's extent: nothing cut off, no wide empty margin on a side
    x0, _, width, _ = (float(v) for v in svg.get("viewBox").split())
    lefts, rights = [], []
    for el in svg.iter():
        tag = el.tag.rsplit("}", 1)[-1]
        if tag == "rect" and el.get("x") is not None:
            lefts.append(float(el.get("x")))
            rights.append(float(el.get("x")) + float(el.get("width")))
        elif tag == "text" and el.get("class") in ("gs-shape", "gs-frame-label"):
            lefts.append(float(el.get("x")))  # drawn from x on, about 7 px a character
            rights.append(float(el.get("x")) + 7 * len(el.text or ""))
    assert x0 <= min(lefts) <= x0 + 20 and x0 + width - 20 <= max(rights) <= x0 + width


# --- worked examples and the Verification page (generated from the real project) ---------


def test_every_entry_has_a_worked_example_that_a_reader_can_run() -> None:
    from sitegen.examples import worked_example

    import gptspec.reference
    from gptspec.spec import REGISTRY

    examples = {e.id: worked_example(e, gptspec.reference) for e in REGISTRY}
    assert [i for i, ex in examples.items() if ex is None] == []
    # the code as shown, run by a fresh interpreter, prints what the page says it printed
    for entry_id in ("softmax", "train", "cross_entropy_mean"):
        example = examples[entry_id]
        assert example is not None
        run = subprocess.run([sys.executable, "-c", example.code], capture_output=True,
                             text=True, timeout=120, cwd=ROOT)
        assert run.returncode == 0, run.stderr
        assert run.stdout == example.output and example.output.strip()
    page = spec_pages.entry_page(views(made_up_entry())[0], [])
    assert "Worked example" not in page  # a function the examples cannot call: none shown


def _verification(run=None) -> str:
    from sitegen.checks import load_checks_for
    from sitegen.verification import verification_page

    import gptspec.reference
    from gptspec.conformance import budgets
    from gptspec.conformance.registry import all_checks
    from gptspec.spec import REGISTRY
    from meta.mutants import MUTANTS

    lookup, _ = load_checks_for()
    entries = spec_pages.build_views(REGISTRY, gptspec.reference, lookup, ROOT)
    return verification_page(entries, all_checks(), MUTANTS, run, budgets)


def test_the_verification_page_shows_budgets_every_check_and_every_mutant(tmp_path) -> None:
    from sitegen.verification import load_mutation_results

    from gptspec.conformance.registry import all_checks
    from meta.mutants import MUTANTS

    page = _verification()
    assert "λ = 6" in page and "Higham" in page and "2<sup>-24</sup>" in page
    checks = all_checks()
    assert all(f"<code>{c.id}</code>" in page for c in checks)
    # a precondition, from the check's own docstring
    assert "W_O = 0, b_O = 0" in page
    assert f"{len(checks)} checks cover" in page
    assert f"through {sum(len(c.entries) for c in checks)} entry–check links" in page
    assert all(f"<code>{m.name}</code>" in page for m in MUTANTS)
    assert "nox -s mutants" in page  # no saved run: says how to get one, shows no kill
    saved = tmp_path / "mutation-results.json"
    first, second = MUTANTS[0], MUTANTS[1]
    saved.write_text(json.dumps({"schema": "gptspec-mutation", "version": 1, "profile": "quick",
                                 "seed": 0, "provenance": {"commit": "abcdef1234567"},
                                 "results": [{"name": first.name, "killed_by": "x.differential",
                                              "on_target": True},
                                             {"name": second.name, "killed_by": "",
                                              "on_target": False},
                                             {"name": MUTANTS[2].name, "killed_by": "",
                                              "on_target": False, "status": "not-run",
                                              "detail": "not run: needs AVX-512 BF16"}]}))
    page = _verification(load_mutation_results(saved))
    assert "<code>x.differential</code>" in page and "survived" in page
    assert "commit abcdef1234" in page and "not in the saved run" in page
    assert "not run: needs AVX-512 BF16" in page  # not counted as survived
    assert page.count('class="gs-missing">survived') == 1


def test_the_traceability_matrix_counts_checks_and_links_apart() -> None:
    from sitegen.checks import load_checks_for

    import gptspec.reference
    from gptspec.conformance.registry import all_checks
    from gptspec.spec import GROUPS, REGISTRY

    lookup, _ = load_checks_for()
    entries = spec_pages.build_views(REGISTRY, gptspec.reference, lookup, ROOT)
    page = spec_pages.render_pages(entries, GROUPS, [])["spec/traceability.md"]
    checks = all_checks()
    assert f"{len(checks)} checks, linked to entries {sum(len(c.entries) for c in checks)} " \
           "times" in page
    assert "(indirect)" in page


def test_the_sources_page_maps_the_notes_next_checks_to_checks_that_exist() -> None:
    import re

    from gptspec.conformance.registry import all_checks

    text = (ROOT / "docs" / "sources.md").read_text(encoding="utf-8")
    section = text.split('three "next checks"', 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if re.match(r"\| [123]\. ", line)]
    named = [re.findall(r"`([a-z_]+\.[a-z_]+)`", row) for row in rows]
    assert len(rows) == 3 and all(len(ids) == 1 for ids in named)
    assert {ids[0] for ids in named} <= {c.id for c in all_checks()}


def test_search_snippets_read_formulas_as_text(tmp_path) -> None:
    from sitegen.search_text import readable, rewrite_index, tex_to_text

    assert tex_to_text(r"\operatorname{softmax}\left(\frac{QK^\top}{\sqrt{d_k}} + M\right) V") \
        == "softmax (QKᵀ/√d_k + M ) V"
    assert tex_to_text(r"\hat{x} = \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}}") \
        == "x̂ = (x - μ)/√(σ^2 + ε)"
    # the index is HTML: a reading goes back into it escaped
    assert readable(r"mask \(M_{ij} = -\infty\) for \(j &gt; i\)") == \
        "mask M_{ij} = -∞ for j &gt; i"
    index = tmp_path / "search_index.json"
    index.write_text(json.dumps({"config": {}, "docs": [
        {"location": "spec/softmax/", "title": "Softmax",
         "text": r"<p>\(\operatorname{softmax}(z)_i = \frac{e^{z_i}}{\sum_j e^{z_j}}\)</p>"}]}))
    assert rewrite_index(index) == 1
    text = json.loads(index.read_text())["docs"][0]["text"]
    assert "\\" not in text and "softmax(z)_i = e^{z_i}/(Σ_j e^{z_j})" in text


def test_a_reference_function_links_to_its_source_line_when_the_repository_is_known() -> None:
    import gptspec.reference

    base = "https://example.invalid/repo/blob/main/"
    linked = spec_pages.reference_code(gptspec.reference, "softmax", ROOT, base)
    # whichever module of the reference defines it (the package is being split by group)
    assert linked is not None and linked.path.startswith("src/gptspec/reference/")
    assert linked.url == f"{base}{linked.path}#L{linked.line}"
    assert f'href="{linked.url}"' in spec_pages._source_link(linked)
    plain = spec_pages.reference_code(gptspec.reference, "softmax", ROOT)
    assert plain is not None and plain.url == "" and "href" not in spec_pages._source_link(plain)


def test_the_preset_pages_show_the_switches_and_gpt3s_published_counts() -> None:
    from gptspec.spec import PRESETS, parameter_count
    from gptspec.spec.config import GPT3_TABLE, PRESET_DECISIONS

    presets = spec_pages.presets_table(PRESETS, parameter_count)
    assert "<b>128</b> (free)" in presets and "FFN</td>" in presets  # gpt3-xl; blueprint
    counts = spec_pages.gpt3_counts_table(GPT3_TABLE, parameter_count)
    assert "<td>125M</td>" in counts and "<td>175B</td>" in counts and "<td>1.167</td>" in counts
    decisions = spec_pages.preset_decisions(PRESET_DECISIONS)
    assert decisions.count("**Decision.**") == len(PRESET_DECISIONS)


# --- issue 30: one consistent document ------------------------------------------------------


def test_a_report_that_does_not_cover_an_entry_adds_nothing_to_its_page(tmp_path: Path) -> None:
    report = tmp_path / "other.json"
    report.write_text(json.dumps({"schema": "gptspec-conformance", "version": 2, "runs": [{
        "backend": {"name": "torch", "version": "2.13.0", "device": "cpu", "dtype": "float32"},
        "settings": {"profile": "quick"},
        "checks": [{"id": "other.thing", "entries": ["other"], "status": "pass",
                    "worst_fraction": 0.5}]}]}))
    page = spec_pages.entry_page(views(made_up_entry())[0], load_report(report))
    assert "Not yet run" not in page and "Results of the built-in backends" not in page
    assert "torch 2.13.0" not in page
    covering = tmp_path / "scale.json"
    covering.write_text(report.read_text().replace('"other.thing", "entries": ["other"]',
                                                   '"scale.differential", "entries": ["scale"]'))
    page = spec_pages.entry_page(views(made_up_entry())[0],
                                 load_report(report) + load_report(covering))
    assert page.count("torch 2.13.0") == 1 and "Results of the built-in backends" in page


def test_a_check_statement_is_its_whole_first_paragraph() -> None:
    from sitegen.checks import _info, first_paragraph

    def check():
        """The first line of a statement that wraps
        onto a second line, and ends here.

        The preconditions, in a paragraph of their own."""

    info = _info(types.SimpleNamespace(id="scale.x", doc=check.__doc__,
                                       summary=check.__doc__.splitlines()[0], ops=()))
    assert info.description == ("The first line of a statement that wraps onto a second "
                                "line, and ends here.")
    assert first_paragraph("\n\n  Leading blank lines.\n\n  Then more.") == "Leading blank lines."
    # a paragraph ending with a colon introduces a list: the statement goes on through it
    assert first_paragraph("Against the spec's:\n\n* one;\n* two, wrapped\n  here.\n\nMore."
                           ) == "Against the spec's: • one; • two, wrapped here."


def test_a_stale_report_gets_a_banner_naming_the_difference() -> None:
    from sitegen.evidence import stale_banner

    assert stale_banner("This report", ["a.x", "b.y"], ["b.y", "a.x"]) == ""
    banner = stale_banner("This report", ["a.x", "old.z"], ["a.x", "b.y"], "0123456789abcdef",
                          "fedcba9876543210")
    assert "Stale evidence" in banner and "<code>b.y</code>" in banner
    assert "<code>old.z</code>" in banner and "0123456789" in banner and "fedcba9876" in banner
    assert "does not record" in stale_banner("R", [], ["a.x"])


def test_the_compatibility_page_marks_each_report_whose_checks_differ(tmp_path: Path) -> None:
    from sitegen import compatibility

    def write(name: str, ids: list[str]) -> None:
        (tmp_path / f"{name}.json").write_text(json.dumps({
            "schema": "gptspec-conformance", "version": 3,
            "provenance": {"commit": "0123456789abcdef"},
            "runs": [{"backend": {"name": name, "dtype": "float32"},
                      "settings": {"profile": "quick"},
                      "checks": [{"id": i, "status": "pass", "worst_fraction": 0.1}
                                 for i in ids]}]}))

    write("current", ["a.x", "b.y"])
    write("old", ["a.x"])
    engines = [types.SimpleNamespace(backend=n, what=n, dtypes=("float32",))
               for n in ("current", "old")]
    page = compatibility.compatibility_page(compatibility.load_runs(tmp_path), engines, [], {},
                                            {"a.x": "forward", "b.y": "forward"})
    current, old = page.split("## old\n")
    assert "1 of these 2 reports ran another set of checks" in current
    assert current.split("## current")[1].count("gs-stale") == 0
    assert old.count("gs-stale") == 1 and "<code>b.y</code>" in old


def test_search_index_text_has_characters_not_references(tmp_path: Path) -> None:
    from sitegen.search_text import rewrite_index, without_entities

    assert without_entities("<code>&lt;entry&gt;</code> Kingma &amp; Ba") == \
        "<code>‹entry›</code> Kingma & Ba"
    assert without_entities("&amp;lt; stays a text") == "＆lt; stays a text"
    index = tmp_path / "search_index.json"
    index.write_text(json.dumps({"config": {}, "docs": [
        {"location": "spec/causal_mask/", "title": "Causal mask",
         "text": r"<p>\(M_{ij} = \begin{cases} 0 &amp; j \le i \\ -\infty &amp; j &gt; i"
                 r"\end{cases}\)</p>"}]}))
    rewrite_index(index)
    text = json.loads(index.read_text())["docs"][0]["text"]
    assert "amp;" not in text and "gt;" not in text and "j › i" in text, text


def test_machine_paths_are_cut_from_saved_text() -> None:
    from sitegen.markup import public_text

    assert public_text("the .py files (/root/.pyenv/versions/3.11.7/lib/python3.11)") == \
        "the .py files (…/lib/python3.11)"
    assert public_text("docs/experiments/vocab.json and https://example.invalid/home/a") == \
        "docs/experiments/vocab.json and https://example.invalid/home/a"


def test_uses_are_read_from_the_sympy_forms() -> None:
    from sitegen.uses import entries_used

    from gptspec.spec import REGISTRY

    assert {"causal_mask", "merge_heads", "scaled_dot_product_attention"} <= set(
        entries_used(REGISTRY["multi_head_attention"]))
    block = set(entries_used(REGISTRY["block_pre_ln"]))
    assert {"layer_norm", "multi_head_attention", "ffn_gelu_tanh"} <= block
    assert "gelu" in entries_used(REGISTRY["ffn_gelu"])
    assert entries_used(REGISTRY["softmax"]) == []


def test_the_mutation_summary_states_what_the_saved_run_measured(tmp_path: Path) -> None:
    from sitegen.verification import load_mutation_results, mutation_summary

    mutants = [types.SimpleNamespace(name=n) for n in ("a", "b", "c", "d")]
    saved = tmp_path / "mutation-results.json"
    saved.write_text(json.dumps({"schema": "gptspec-mutation", "version": 1, "results": [
        {"name": "a", "killed_by": "x.y", "on_target": True},
        {"name": "b", "killed_by": "x.y", "on_target": True},
        {"name": "c", "killed_by": "", "on_target": False, "status": "not-run",
         "detail": "not run: needs AVX-512 BF16, which this machine lacks"}]}))
    text = mutation_summary(mutants, load_mutation_results(saved))
    assert "2 of 4 mutants were killed on target" in text
    assert "1 were not run" in text and "needs AVX-512 BF16, which that machine lacks" in text
    assert "1 are newer than the run (`d`)" in text


def test_the_conformance_page_marks_a_report_of_another_suite(tmp_path: Path) -> None:
    run = {"backend": {"name": "torch", "version": "2.13.0", "device": "cpu", "dtype": "float32"},
           "settings": {"profile": "quick"},
           "checks": [{"id": "scale.differential", "entries": ["scale"], "status": "pass",
                       "worst_fraction": 0.5}]}
    current = tmp_path / "current.json"
    current.write_text(json.dumps({"schema": "gptspec-conformance", "version": 3,
                                   "runs": [run]}))
    pages = spec_pages.render_pages(views(made_up_entry()), ["attention"], load_report(current))
    assert "gs-stale" not in pages["spec/conformance.md"]
    run["checks"][0]["id"] = "scale.retired"
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema": "gptspec-conformance", "version": 3, "runs": [run],
                               "provenance": {"commit": "0123456789abcdef"}}))
    page = spec_pages.render_pages(views(made_up_entry()), ["attention"],
                                   load_report(old))["spec/conformance.md"]
    assert page.count("gs-stale") == 1 and "(old.json)" in page
    assert "<code>scale.differential</code>" in page and "<code>scale.retired</code>" in page
    assert "0123456789" in page



def test_a_report_of_one_area_is_compared_with_that_area_s_checks(tmp_path: Path) -> None:
    """``--area forward`` runs the forward checks only (the docs session's 16-bit reports
    do): the others missing is what was asked for, not stale evidence; a forward check
    missing still is."""
    run = {"backend": {"name": "torch", "version": "2.13.0", "device": "cpu", "dtype": "float16"},
           "settings": {"profile": "quick", "area": "forward"},
           "checks": [{"id": "scale.differential", "entries": ["scale"], "status": "pass",
                       "worst_fraction": 0.5}]}
    report = tmp_path / "forward.json"
    report.write_text(json.dumps({"schema": "gptspec-conformance", "version": 3,
                                  "runs": [run]}))
    suite = {"scale.differential", "scale.trained", "scale.other"}
    areas = {"scale.differential": "forward", "scale.trained": "training",
             "scale.other": "forward"}
    page = spec_pages.conformance_page(load_report(report), suite, areas=areas)
    assert page.count("gs-stale") == 1 and "area forward" in page
    assert "<code>scale.other</code>" in page and "scale.trained" not in page
    areas["scale.other"] = "training"
    assert "gs-stale" not in spec_pages.conformance_page(load_report(report), suite, areas=areas)
    # a report of every area is compared with the whole suite
    run["settings"]["area"] = "all"
    report.write_text(json.dumps({"schema": "gptspec-conformance", "version": 3,
                                  "runs": [run]}))
    assert "<code>scale.trained</code>" in spec_pages.conformance_page(
        load_report(report), suite, areas=areas)


def test_the_keyhole_section_counts_what_the_saved_run_measured(tmp_path: Path) -> None:
    from sitegen.verification import keyhole_section, load_keyhole_results

    saved = tmp_path / "keyhole-results.json"
    saved.write_text(json.dumps({"schema": "gptspec-keyhole", "version": 1, "profile": "quick",
                                 "seed": 0, "provenance": {"commit": "0123456789abcdef"},
                                 "results": [
        {"name": "a", "breaks": ["layer_norm"], "named": ["layer_norm"], "killed": True,
         "localised": True, "applicable": True},
        {"name": "b", "breaks": ["softmax"], "named": ["causal_mask"], "killed": True,
         "localised": False, "applicable": True, "why": "the same function as a mask bug"},
        {"name": "c", "breaks": ["softmax"], "named": [], "killed": False,
         "localised": False, "applicable": True},
        {"name": "d", "breaks": ["one_hot"], "named": [], "killed": False,
         "localised": False, "applicable": False}]}))
    text = keyhole_section(load_keyhole_results(saved), "..", {"layer_norm", "softmax"})
    assert "**2 of 3**" in text and "**1 of 3**" in text and "1 leave the built-in" in text
    assert "0123456789" in text and '<span class="gs-missing">no</span>' in text
    assert "<code>b</code>: the same function as a mask bug" in text
    assert "no account given" in text and "partial run" not in text
    partial = {**load_keyhole_results(saved), "complete": False}
    assert "partial run" in keyhole_section(partial, "..", set())
    assert "No saved run" in keyhole_section(None, "..", set())
    saved.write_text('{"schema": "other"}')
    with pytest.raises(ValueError, match="not a gptspec-keyhole file"):
        load_keyhole_results(saved)


def test_an_entry_page_states_one_budget_the_one_its_check_computes() -> None:
    """The Tolerance section states the budget the entry's own check registers (and its
    reports carry); the check's row points there instead of stating it a second time."""
    page = spec_pages.entry_page(views(made_up_entry())[0], reports=[])
    tolerance, checks_table = page.split("## Tolerance\n", 1)[1].split("## Conformance checks", 1)
    budget = r"\sqrt{n}\,u of float32"
    assert budget in tolerance and "<code>scale.differential</code>" in tolerance
    assert "one rounding" in tolerance  # the spec's derivation beside it
    assert r"\(\sqrt{n}\,u\)" not in tolerance  # the spec's own formula is not a second one
    assert budget not in checks_table and spec_pages.BUDGET_ABOVE in checks_table

    # an entry judged only inside larger computations: the spec's formula, said to be so
    def others(entry_id: str) -> list[CheckInfo]:
        return [CheckInfo("model.differential", "the model's budget", "a whole model",
                          ops=(entry_id,))]

    page = spec_pages.entry_page(views(made_up_entry(), others)[0], reports=[])
    tolerance, checks_table = page.split("## Tolerance\n", 1)[1].split("## Conformance checks", 1)
    assert r"\(\sqrt{n}\,u\)" in tolerance and "No check judges this entry on its own" in tolerance
    assert "the model&#x27;s budget" in checks_table or "the model's budget" in checks_table
    assert spec_pages.BUDGET_ABOVE not in checks_table


def test_wrapped_python_continues_with_a_hanging_indent() -> None:
    """Each line of generated Python is a block indented by its own leading spaces, so a
    wrapped line continues spec_pages.HANGING columns further right, not at column 0."""
    out = spec_pages._python_html('def f(x):\n    return (x +\n            1)\n\n    # end\n')
    lines = re.findall(r'<span class="gs-line" style="padding-left: (\d+)ch; '
                       r'text-indent: -(\d+)ch">', out)
    hang = spec_pages.HANGING
    assert [int(p) for p, _ in lines] == [hang, 4 + hang, 12 + hang, hang, 4 + hang]
    assert all(p == t for p, t in lines) and "\n</span>" not in out
    text = re.sub(r"<[^>]+>", "", out)
    assert "return (x +" in text and "            1)" in text  # the code itself unchanged


def test_every_cited_document_has_authors_a_date_and_a_link_where_known() -> None:
    """The Sources page gives each cited document's authors, date and address (a link),
    and says so where the project's copy does not state them."""
    from gptspec.spec import REGISTRY, sources

    cited = {s.document for e in REGISTRY for s in e.sources}
    assert cited <= set(sources.REFERENCES), cited - set(sources.REFERENCES)
    page = spec_pages.crosswalk(REGISTRY, "../spec")
    for document in cited:
        section = page.split(f"#{spec_pages.source_anchor(document)} }}", 1)[1].split("###")[0]
        ref = sources.REFERENCES[document]
        assert "<strong>Authors:</strong>" in section and "<strong>Date:</strong>" in section
        assert (f'<a href="{ref.url}">' in section) if ref.url else "No address" in section
    assert 'href="https://arxiv.org/abs/2410.19370"' in page  # the Notes, by their arXiv id
    with pytest.raises(spec_pages.TraceabilityError):
        spec_pages.reference_line(None)


def test_the_conformance_page_opens_with_a_matrix_of_checks_by_report(tmp_path: Path) -> None:
    """Checks × reports, each cell the status and the share of the budget, an empty cell
    where a report did not run the check; each report's full table folded below."""
    def write(name: str, dtype: str, checks: list[dict]) -> Path:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"schema": "gptspec-conformance", "version": 2, "runs": [
            {"backend": {"name": "torch", "version": "2", "device": "cpu", "dtype": dtype},
             "settings": {"profile": "quick"}, "checks": checks}]}))
        return path

    a = write("a", "float32", [
        {"id": "x.differential", "entries": ["x"], "status": "pass", "worst_fraction": 0.25},
        {"id": "y.differential", "entries": ["y"], "status": "fail", "worst_fraction": 3.0}])
    b = write("b", "bfloat16", [
        {"id": "x.differential", "entries": ["x"], "status": "pass", "worst_fraction": 0.5}])
    page = spec_pages.conformance_page(load_report(a) + load_report(b))
    summary = page.split("## Summary", 1)[1].split("## ", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", summary)
    assert "float32" in rows[0] and "bfloat16" in rows[0]
    x, y = (next(r for r in rows if f"<code>{c}</code>" in r) for c in
            ("x.differential", "y.differential"))
    assert re.findall(r"<td>(.*?)</td>", x)[1:] == [
        '<span class="gs-status gs-pass">pass</span> 25%',
        '<span class="gs-status gs-pass">pass</span> 50%']
    assert re.findall(r"<td>(.*?)</td>", y)[1:] == [
        '<span class="gs-status gs-fail">fail</span> 300%', ""]  # b did not run it
    assert "1 fail, 1 pass" in summary and page.count("<details>") == 2


def test_an_entry_page_shows_its_results_as_one_matrix(tmp_path: Path) -> None:
    """One table of the entry's checks × the reports that ran them, whatever their number,
    and what produced each report in one footnote."""
    def write(name: str, dtype: str, fraction: float) -> list:
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"schema": "gptspec-conformance", "version": 2, "runs": [
            {"backend": {"name": "torch", "version": "2", "device": "cpu", "dtype": dtype},
             "settings": {"profile": "quick"},
             "checks": [{"id": "scale.differential", "entries": ["scale"], "status": "pass",
                         "worst_fraction": fraction}]}]}))
        return load_report(path)

    page = spec_pages.entry_page(views(made_up_entry())[0],
                                 write("a", "float32", 0.25) + write("b", "bfloat16", 0.5))
    results = page.split("## Results of the built-in backends", 1)[1]
    assert results.count("<table>") == 1
    assert "<th>[1] float32</th><th>[2] bfloat16</th>" in results
    assert "pass</span> 25%</td><td>" in results and "pass</span> 50%</td>" in results
    assert "[1] torch 2 · cpu · float32 (profile quick" in results
    assert "[2] torch 2 · cpu · bfloat16 (profile quick" in results


def test_the_compatibility_page_opens_with_a_matrix_of_checks_by_engine_and_dtype() -> None:
    """Over the committed reports: each group's matrix has a column per report (engine ·
    dtype) and a row per check its reports hold, each cell the report's status and share
    of the budget; a check a report does not hold, an empty cell."""
    import hooks

    page = hooks._compatibility_page(ROOT)
    reports = {}
    for path in sorted((ROOT / "docs" / "ecosystem").glob("*.json")):
        for run in json.loads(path.read_text())["runs"]:
            reports[(run["backend"]["name"], run["backend"]["dtype"])] = {
                c["id"]: c for c in run["checks"]}
    matrices = re.findall(r'<div class="gs-results gs-matrix">(.*?)</table>', page, re.S)
    assert len(matrices) >= 2 and page.index("gs-matrix") < page.index("\n## ")
    seen = set()
    for matrix in matrices:
        head, *rows = re.findall(r"<tr>(.*?)</tr>", matrix, re.S)
        columns = [tuple(re.sub(r"<[^>]+>", "", h).split(" · "))
                   for h in re.findall(r"<th>(.*?)</th>", head)[1:]]
        seen.update(columns)
        checks = {c for col in columns for c in reports[col]}
        ids = [re.search(r"<code>(.*?)</code>", r).group(1) for r in rows]
        assert sorted(ids) == sorted(checks)
        for check, row in zip(ids, rows, strict=True):
            cells = re.findall(r"<td>(.*?)</td>", row, re.S)[1:]
            for col, cell in zip(columns, cells, strict=True):
                c = reports[col].get(check)
                if c is None:
                    assert cell == "", (col, check)
                    continue
                assert f'class="gs-status gs-{c["status"]}"' in cell, (col, check, cell)
                f = c.get("worst_fraction")
                if isinstance(f, (int, float)) and f != float("inf"):
                    assert cell.endswith(f" {spec_pages.percent(f)}"), (col, check, cell)
    assert seen == set(reports)


def test_the_soundness_section_shows_the_runs_of_the_judge_as_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sitegen.verification import load_soundness_ledger, soundness_section

    from meta.soundness import gate
    from meta.soundness.gate import BACKENDS, FULL_DTYPES, PROFILE_OF, ledger_summary

    monkeypatch.setattr(gate, "ROOT", tmp_path)
    code = ("src/judge.py",)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "judge.py").write_text("# before\n")
    before = gate.judge_identity(code)
    (tmp_path / "src" / "judge.py").write_text("# now\n")
    now = gate.judge_identity(code)

    def run(judge: str, backend: str, dtype: str, seed: int, passed: bool = True,
            worst: float = 0.25) -> dict:
        return {"judge": judge, "code": list(code), "area": "all", "backend": backend,
                "dtype": dtype,
                "seed": seed, "profile": PROFILE_OF.get(backend, "thorough"),
                "passed": passed, "worst": worst, "worst_check": "softmax.differential",
                "failures": [] if passed else ["softmax.differential"], "seconds": 600,
                "when": "2026-11-27T20:00:00+00:00"}

    ledger = tmp_path / "ledger.jsonl"
    rows = [run(now, b, d, 5) for b in BACKENDS for d in FULL_DTYPES]  # one whole seed
    rows += [run(now, "numpy-emulated", "float16", 6, worst=0.5),
             run(before, "numpy-emulated", "float16", 7, passed=False, worst=1.5)]
    ledger.write_text("".join(json.dumps(r) + "\n" for r in rows))
    entries = load_soundness_ledger(ledger)
    assert entries is not None
    text = soundness_section(entries, gate.current_runs(entries), ledger_summary(ledger)[0])
    assert "every backend × dtype (12 runs each): 1: 5" in text
    assert "seeds begun: 6 (1 of 12)" in text and "1 on code changed since" in text
    assert text.count("<tr>") == 1 + 13  # the header, and the runs on this code only
    assert "150 %" not in text and "50 %" in text and "FAIL" not in text
    (tmp_path / "src" / "judge.py").write_text("# before\n")  # the code as it was
    failing = soundness_section(entries, gate.current_runs(entries), ledger_summary(ledger)[0])
    assert '<span class="gs-missing">FAIL</span>' in failing and "150 %" in failing
    assert "No ledger" in soundness_section(None, [], "")
    ledger.write_text('{"judge": "now"}\n')
    with pytest.raises(ValueError, match="not a run of the gate"):
        load_soundness_ledger(ledger)
