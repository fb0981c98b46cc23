"""The spec site as a reader sees it: built with --strict, served on 127.0.0.1, opened in
headless Chromium.

Needs Debian's chromium (``apt-get install -y chromium``), node and npm (KaTeX comes from
the npm registry the first time, then from .cache/katex). The site server is the
browser's only proxy (see cdp_browser.py), so every request the browser makes is logged;
the pages' own requests are also recorded through the DevTools protocol.

A screenshot of one equation page is kept in out/docs-site/ (printed by the test).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from cdp_browser import (  # noqa: E402
    CLIPPED_JS,
    MATH_STATS_JS,
    RAW_MATH_JS,
    SIDEWAYS_JS,
    Browser,
    SiteServer,
    off_machine,
)

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "out" / "docs-site"
GUIDES = ("", "model/", "notation/", "training/", "generation/", "backend/", "conformance-report/",
          "figures/", "sources/")

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site") / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
         "-d", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=800)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-4000:]}"
    return out


@pytest.fixture(scope="module")
def entries() -> list:
    from gptspec.spec import REGISTRY

    return list(REGISTRY)


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[tuple[SiteServer, Browser]]:
    with SiteServer(site) as server, tempfile.TemporaryDirectory() as profile:
        browser = Browser(Path(profile), server.netloc)
        try:
            yield server, browser
        finally:
            browser.close()


def test_every_entry_has_a_page_and_the_matrix_lists_it(site: Path, entries: list) -> None:
    assert entries, "the spec registry is empty"
    matrix = (site / "spec" / "traceability" / "index.html").read_text(encoding="utf-8")
    for e in entries:
        assert (site / "spec" / e.id / "index.html").is_file(), e.id
        assert f"<code>{e.id}</code>" in matrix, e.id
    assert "gs-missing" not in matrix


def test_the_model_page_lists_every_preset(site: Path) -> None:
    from gptspec.spec import PRESETS, parameter_count

    model = (site / "model" / "index.html").read_text(encoding="utf-8")
    for name, config in PRESETS.items():
        assert f"<td><code>{name}</code></td>" in model, name
        assert f"{parameter_count(config):,}" in model, name


# A script, image, frame, stylesheet, preload, font or import fetched from another host.
OUTSIDE_ASSET = re.compile(
    r"""<(?:script|img|iframe|source)[^>]*\ssrc=["']?(?:https?:)?//"""
    r"""|<link[^>]*rel=["']?(?:stylesheet|preload|preconnect|icon)[^>]*href=["']?(?:https?:)?//"""
    r"""|url\(\s*["']?(?:https?:)?//|@import\s+["']?(?:https?:)?//""",
    re.IGNORECASE)


def outside_assets(site: Path) -> list[str]:
    found = []
    for path in site.rglob("*"):
        if path.suffix in (".html", ".css"):
            text = path.read_text(encoding="utf-8", errors="replace")
            found += [f"{path.relative_to(site)}: {m.group(0)[:100]}"
                      for m in OUTSIDE_ASSET.finditer(text)]
    return found


def test_no_page_links_an_outside_asset(site: Path) -> None:
    """Nothing in the built site loads a script, style, font or image from outside."""
    assert not outside_assets(site)


def test_the_repository_link_fetches_nothing(site: Path) -> None:
    """The theme's stock repository link (data-md-component="source") makes its script ask
    GitHub's API for stars and forks from the reader's browser; the site's own partial
    (docs/overrides) links the repository without it."""
    pages = list(site.rglob("*.html"))
    assert any('class="md-source"' in p.read_text(encoding="utf-8") for p in pages)
    assert not [p for p in pages if 'data-md-component="source"' in p.read_text(encoding="utf-8")]


def test_the_outside_asset_scan_catches_each_kind(tmp_path: Path) -> None:
    planted = ['<script src="https://cdn.example.invalid/katex.js"></script>',
               '<link rel="stylesheet" href="//fonts.example.invalid/css">',
               '<img alt="" src="http://img.example.invalid/a.png">',
               "@font-face { src: url('https://fonts.example.invalid/f.woff2') }",
               '@import "https://cdn.example.invalid/x.css";']
    for i, text in enumerate(planted):
        (tmp_path / f"p{i}.{'css' if text.startswith('@') else 'html'}").write_text(text)
    (tmp_path / "fine.html").write_text('<a href="https://example.invalid/">a link</a>'
                                        '<script src="assets/katex/katex.min.js"></script>')
    assert len(outside_assets(tmp_path)) == len(planted)


def test_equations_render_on_every_page(served: tuple[SiteServer, Browser], entries: list
                                        ) -> None:
    server, browser = served
    equation_pages = {f"spec/{e.id}/" for e in entries}
    pages = sorted(equation_pages) + ["spec/", "spec/traceability/", "spec/verification/",
                                      "spec/compatibility/"] + list(GUIDES)
    problems = []
    fonts = None
    for page in pages:
        browser.navigate(server.url + page)
        try:
            stats = browser.wait_for(
                f"(() => {{ const s = {MATH_STATS_JS}; "
                "return s.katex + s.errors === s.arithmatex ? s : null; })()",
                f"KaTeX to typeset {page}", seconds=20)
        except Exception as err:  # report every page, not just the first
            problems.append(f"{page}: {err}; {browser.evaluate(MATH_STATS_JS)}")
            continue
        if page in equation_pages and stats["katex"] == 0:
            problems.append(f"{page}: no equation on an equation page")
        if stats["errors"]:
            problems.append(f"{page}: {stats['errors']} KaTeX error(s)")
        raw = browser.evaluate(RAW_MATH_JS)
        if raw:
            problems.append(f"{page}: raw LaTeX left: {raw[:3]}")
        if fonts is None and page in equation_pages:  # KaTeX's fonts came from this site
            fonts = browser.evaluate("document.fonts.ready.then(() => "
                                     "document.fonts.check('16px KaTeX_Main'))")
    assert not problems, "\n".join(problems)
    assert fonts, "KaTeX's fonts did not load"


DESKTOP_WIDTHS = (1280, 1400, 1920)


def _typeset(browser: Browser, page: str) -> None:
    browser.wait_for(f"(() => {{ const s = {MATH_STATS_JS}; "
                     "return s.katex + s.errors === s.arithmatex; })()",
                     f"KaTeX to typeset {page}", seconds=20)


def test_nothing_is_clipped_at_desktop_widths(served: tuple[SiteServer, Browser], entries: list
                                              ) -> None:
    """At 1280, 1400 and 1920 px no display equation or code block is wider than its box,
    and no table runs past the page without a visible scroll bar, on any page."""
    server, browser = served
    pages = sorted(f"spec/{e.id}/" for e in entries) + ["spec/", "spec/traceability/",
                                                         "spec/conformance/",
                                                         "spec/verification/",
                                                         "spec/compatibility/", *GUIDES]
    clipped, measured = [], {"equation": 0, "code": 0, "table": 0}
    try:
        for page in pages:
            browser.navigate(server.url + page)
            _typeset(browser, page)
            for kind, selector in (("equation", "div.arithmatex"), ("code", "pre > code"),
                                   ("table", "table")):
                measured[kind] += browser.evaluate(
                    f"document.querySelector('article').querySelectorAll('{selector}').length")
            for width in DESKTOP_WIDTHS:
                browser.set_width(width)
                clipped += [f"{page} at {width} px: {c}" for c in browser.evaluate(CLIPPED_JS)]
    finally:
        browser.set_width(1280)
    print(f"\n{len(pages)} pages at {DESKTOP_WIDTHS} px; measured per width: {measured}; "
          f"clipped: {len(clipped)}")
    assert measured["equation"] > len(entries) and measured["code"] > len(entries)
    assert not clipped, f"{len(clipped)} clipped:\n" + "\n".join(clipped[:40])


PHONE_WIDTH = 390


def test_no_page_scrolls_sideways_on_a_phone(served: tuple[SiteServer, Browser], entries: list
                                             ) -> None:
    """At 390 px no page is wider than the window: a wide equation, code block, table or
    figure scrolls inside its own box, and a figure keeps a readable width (at least
    600 px, or its own) in a box that scrolls rather than shrinking to the screen."""
    server, browser = served
    pages = sorted(f"spec/{e.id}/" for e in entries) + ["spec/", "spec/traceability/",
                                                         "spec/conformance/",
                                                         "spec/verification/",
                                                         "spec/compatibility/",
                                                         "open-questions/", *GUIDES]
    wrong = []
    try:
        browser.set_width(PHONE_WIDTH)
        for page in pages:
            browser.navigate(server.url + page)
            _typeset(browser, page)
            wrong += [f"{page}: {w}" for w in browser.evaluate(SIDEWAYS_JS)]
    finally:
        browser.set_width(1280)
    assert not wrong, f"{len(wrong)} at {PHONE_WIDTH} px:\n" + "\n".join(wrong[:40])


STATEMENTS_OUT_OF_VIEW_JS = """(() => {
  const out = [];
  for (const row of document.querySelectorAll('.gs-checks tbody tr')) {
    const cell = row.querySelector('td:last-child');
    const r = cell.getBoundingClientRect();
    let scrolled = 0;
    for (let el = cell; el; el = el.parentElement) scrolled += el.scrollLeft;
    if (!cell.innerText.trim() || r.width < 100 || r.left < 0
        || r.right > document.documentElement.clientWidth + 1 || scrolled)
      out.push(row.querySelector('td').innerText + ': ' + Math.round(r.left) + '..' +
               Math.round(r.right));
  }
  return [document.querySelectorAll('.gs-checks tbody tr').length, out];
})()"""


def test_check_statements_are_in_view_on_a_phone(served: tuple[SiteServer, Browser],
                                                 entries: list) -> None:
    """At 390 px every row of an entry page's checks table shows its statement ("What it
    checks") inside the window, with nothing scrolled: in three columns it sat off to the
    right and the rows looked empty until the table was scrolled."""
    server, browser = served
    wrong, rows = [], 0
    try:
        browser.set_width(PHONE_WIDTH)
        for page in sorted(f"spec/{e.id}/" for e in entries):
            browser.navigate(server.url + page)
            _typeset(browser, page)
            n, out = browser.evaluate(STATEMENTS_OUT_OF_VIEW_JS)
            rows += n
            wrong += [f"{page} {w}" for w in out]
    finally:
        browser.set_width(1280)
    assert rows > len(entries), rows
    assert not wrong, f"{len(wrong)} statements out of view at {PHONE_WIDTH} px:\n" + \
        "\n".join(wrong[:40])


def test_screenshot_of_an_equation_page(served: tuple[SiteServer, Browser], entries: list
                                        ) -> None:
    """Multi-head attention's page at 1400 px: its equation is the longest of the forward
    pass; the screenshot is kept for a person to look at."""
    server, browser = served
    entry = next((e for e in entries if e.id == "multi_head_attention"), entries[0])
    browser.set_width(1400)
    try:
        browser.navigate(server.url + f"spec/{entry.id}/")
        _typeset(browser, entry.id)
        browser.evaluate("document.fonts.ready.then(() => true)")
        path = browser.screenshot(ARTIFACTS / f"spec-{entry.id}-1400px.png")
    finally:
        browser.set_width(1280)
    print(f"\nscreenshot of {entry.id}'s page at 1400 px: {path}")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000


def test_navigation_reaches_an_equation_from_the_home_page(
        served: tuple[SiteServer, Browser], entries: list) -> None:
    server, browser = served
    browser.navigate(server.url)
    # The sidebar's link to the specification index, clicked as a reader would.
    assert browser.evaluate(
        "(() => { const a = [...document.querySelectorAll('nav.md-nav a')]"
        ".find(a => a.getAttribute('href').endsWith('spec/')); if (!a) return false;"
        " a.click(); return true; })()")
    browser.wait_for("location.pathname.endsWith('/spec/') && document.readyState === "
                     "'complete'", "the specification index")
    first = entries[0]
    assert browser.evaluate(
        "(() => { const a = [...document.querySelectorAll('article a')].find(a => "
        f"a.getAttribute('href').replace(/\\/$/, '').endsWith('{first.id}')); "
        "if (!a) return false; a.click(); return true; })()")
    browser.wait_for(f"location.pathname.endsWith('/spec/{first.id}/') && "
                     "document.readyState === 'complete'", f"{first.id}'s page")
    assert browser.evaluate("document.querySelector('article h1').firstChild.textContent.trim()") \
        == first.title


def test_the_diagram_links_to_equation_pages(served: tuple[SiteServer, Browser]) -> None:
    server, browser = served
    browser.navigate(server.url + "model/")
    hrefs = browser.evaluate("[...document.querySelectorAll('.gs-dataflow svg a')]"
                             ".map(a => a.href.baseVal || a.getAttribute('href'))")
    assert len(hrefs) >= 10, hrefs  # every step of the forward pass has its entry
    statuses = browser.evaluate(
        "Promise.all([...document.querySelectorAll('.gs-dataflow svg a')].map(a => "
        "fetch(new URL(a.getAttribute('href'), location.href)).then(r => r.status)))")
    assert statuses == [200] * len(hrefs), list(zip(hrefs, statuses, strict=True))


def test_the_figures_were_made_and_load(served: tuple[SiteServer, Browser]) -> None:
    server, browser = served
    browser.navigate(server.url + "figures/")
    sizes = browser.wait_for(
        "(() => { const im = [...document.querySelectorAll('article img')];"
        " return im.length && im.every(i => i.complete) ? im.map(i => i.naturalWidth) : null;"
        " })()", "the figures to load")
    assert len(sizes) == 2 and all(w > 300 for w in sizes), sizes


def test_search_finds_an_equation(served: tuple[SiteServer, Browser], entries: list) -> None:
    server, browser = served
    entry = next((e for e in entries if e.id == "softmax"), entries[0])
    browser.navigate(server.url)
    browser.evaluate("document.querySelector('input.md-search__input').focus()")
    word = entry.title.split()[0].lower()
    browser.type_text(word)
    # wait for the results of the whole word, not of a prefix typed so far (a result's link
    # carries its query as ?h=…; a page matched only in its sections has an empty h=)
    hrefs = browser.wait_for(
        "(() => { const r = [...document.querySelectorAll('.md-search-result__item a')]"
        ".map(a => a.getAttribute('href'));"
        " const q = r.map(h => (h.match(/[?&]h=([^&#]*)/) || [])[1] || '');"
        f" return r.length && q.includes('{word}') && q.every(w => !w || w === '{word}')"
        " ? r : null; })()",
        "search results", seconds=30)
    assert any(f"spec/{entry.id}/" in h for h in hrefs), hrefs
    snippets = browser.evaluate("[...document.querySelectorAll('.md-search-result__item')]"
                                ".map(e => e.textContent).join(' ')")
    assert "\\frac" not in snippets and "\\operatorname" not in snippets, snippets[:500]


def test_the_search_index_holds_no_raw_tex(site: Path) -> None:
    import json

    docs = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))["docs"]
    raw = [d["location"] for d in docs if re.search(r"\\[(\[]|\\frac|\\operatorname", d["text"])]
    assert raw == [], raw[:10]
    softmax = next(d for d in docs if d["location"] == "spec/softmax/")
    assert "softmax(z)_i = e^{z_i}/(Σ_{j=1}^n e^{z_j})" in softmax["text"]


def test_no_request_left_the_machine(served: tuple[SiteServer, Browser]) -> None:
    """Runs after the page tests: everything they loaded is in the logs."""
    server, browser = served
    browser.pump(1.0)
    page_requests = browser.requested_urls()
    assert len(page_requests) > 20  # the logs did record the pages' requests
    assert any("search_index.json" in u for u in server.log.served)  # the search worker's
    assert not off_machine(page_requests, server.netloc)
    assert not off_machine(server.log.served, server.netloc)
    # The browser's own services may try to call home; the proxy refused them. None of
    # those is a request of the site's pages.
    assert not set(server.log.refused) & set(page_requests)
    print(f"\n{len(page_requests)} page requests, all to {server.netloc}; "
          f"{len(server.log.refused)} requests of Chromium's own services refused")


def test_the_checks_catch_a_broken_page(tmp_path: Path) -> None:
    """A page with untypeset math and an outside asset fails the checks above."""
    (tmp_path / "index.html").write_text(
        "<!doctype html><html><head><title>broken</title>"
        '<link rel="stylesheet" href="http://cdn.gptspec-test.invalid/katex.css"></head>'
        '<body><article style="width: 400px"><p class="arithmatex">\\(x^2\\)</p>'
        '<div class="arithmatex" style="overflow: hidden; white-space: nowrap">' + "x + " * 200 + "</div>"
        '<pre style="overflow: hidden"><code>' + "y = 1; " * 200 + "</code></pre>"
        '<div><table><tr><td style="white-space: nowrap">' + "wide " * 200
        + "</td></tr></table></div></article>"
        '<img src="http://cdn.gptspec-test.invalid/x.png"></body></html>', encoding="utf-8")
    with SiteServer(tmp_path) as server, tempfile.TemporaryDirectory() as profile:
        browser = Browser(Path(profile), server.netloc)
        try:
            browser.navigate(server.url)
            browser.pump(1.0)
            assert browser.evaluate(RAW_MATH_JS) == ["\\(x^2\\)"]
            stats = browser.evaluate(MATH_STATS_JS)
            assert stats["katex"] < stats["arithmatex"]
            leaked = off_machine(browser.requested_urls(), server.netloc)
            assert [c["kind"] for c in browser.evaluate(CLIPPED_JS)] == ["equation", "code",
                                                                         "table"]
            assert any("cdn.gptspec-test.invalid" in u for u in leaked), leaked
            assert any("cdn.gptspec-test.invalid" in u for u in server.log.refused)
        finally:
            browser.close()


def test_mkdocs_serve_serves_the_generated_pages(tmp_path: Path) -> None:
    """What `nox -s docs -- serve` runs: the hooks work under `mkdocs serve` too."""
    import socket
    import time
    import urllib.request

    with socket.socket() as s:  # a free port on the loopback
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # mkdocs serve mounts the site at site_url's path (/gptspec/ for the placeholder)
    import re
    from urllib.parse import urlparse
    found = re.search(r"^site_url:\s*(\S+)", (ROOT / "mkdocs.yml").read_text(encoding="utf-8"),
                      re.M)
    base = (urlparse(found[1]).path if found else "/").rstrip("/")
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mkdocs", "serve", "-f", str(ROOT / "mkdocs.yml"),
         "--dev-addr", f"127.0.0.1:{port}", "--no-livereload"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        page = None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{base}/spec/", timeout=5) as r:
                    page = r.read().decode("utf-8")
                    break
            except OSError:
                time.sleep(1)
        assert page is not None, (tmp_path / "serve.log").read_text()[-3000:]
        assert "The specification" in page and 'class="arithmatex"' in page
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{base}/assets/katex/katex.min.js",
                                    timeout=5) as r:
            assert r.status == 200 and b"katex" in r.read(2000)
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=20)
        log.close()


# --- issue 30: the site as one consistent document (read from the built pages) -----------

# A machine's absolute path: a home or checkout, an interpreter's folder, a temporary file.
MACHINE_PATH = re.compile(r"(?<![\w.:/])(?:/(?:root|home|Users|tmp|work|private)/[^\s\"'<>]+"
                          r"|/usr/(?:local/)?lib/python[^\s\"'<>]*|[^\s\"'<>]*\.pyenv/"
                          r"|[A-Za-z]:\\Users\\)")


def machine_paths(site: Path) -> list[str]:
    """Every machine path in the site's pages, its search index and its sitemap."""
    found = []
    for path in sorted(site.rglob("*")):
        if path.suffix in (".html", ".xml", ".txt", ".json", ".svg"):
            text = path.read_text(encoding="utf-8", errors="replace")
            found += [f"{path.relative_to(site)}: {m.group(0)[:80]}"
                      for m in MACHINE_PATH.finditer(text)]
    return found


def test_no_page_shows_a_machine_path(site: Path, tmp_path: Path) -> None:
    assert machine_paths(site) == []
    # the scan finds what it looks for
    (tmp_path / "index.html").write_text(
        "<p>Data: the .py files (/root/.pyenv/versions/3.11.7/lib/python3.11), and "
        "/home/someone/gptspec/x.py; not https://example.invalid/home/a</p>")
    (tmp_path / "study.json").write_text('{"data": "the .py files (/root/.pyenv/lib)"}')
    assert len(machine_paths(tmp_path)) == 3


def _article(site: Path, page: str) -> str:
    text = (site / page / "index.html").read_text(encoding="utf-8")
    return text.split("<article", 1)[1].split("</article>", 1)[0]


def test_check_statements_are_whole(site: Path) -> None:
    """Each entry page states every check of the entry by its docstring's whole first
    paragraph, not its first line (which cut 27 of 71 statements mid-sentence)."""
    import html

    sys.path.insert(0, str(ROOT / "docs"))
    from sitegen.checks import first_paragraph

    from gptspec.conformance.registry import all_checks

    checks = all_checks()
    wrapped = [c for c in checks if first_paragraph(c.doc) != c.doc.splitlines()[0].strip()]
    assert wrapped, "no check's statement spans lines: this test would prove nothing"
    cut = [c.id for c in checks if first_paragraph(c.doc).endswith((":", ",", ";"))]
    assert cut == [], "statements that stop before what they announce"
    missing = []
    for c in checks:
        statement = html.escape(first_paragraph(c.doc), quote=True)
        for entry_id in c.entries:
            if f"<td>{statement}</td>" not in _article(site, f"spec/{entry_id}"):
                missing.append(f"{entry_id}: {c.id}")
    assert missing == []


def test_no_entry_page_claims_a_run_that_no_report_made(site: Path, entries: list) -> None:
    """A report that does not cover an entry adds nothing to its page: no "Not yet run",
    and no results section unless some report holds a check of the entry."""
    sys.path.insert(0, str(ROOT / "docs"))
    from sitegen.conformance_results import load_reports

    reports = load_reports(ROOT)
    wrong = []
    for e in entries:
        page = _article(site, f"spec/{e.id}")
        covered = any(r.for_entry(e.id) for r in reports)
        if "Not yet run" in page or ("results-of-the-built-in-backends" in page) != covered:
            wrong.append(e.id)
    assert wrong == []


def _ecosystem_reports() -> list[tuple[str, str, set[str]]]:
    import json

    found = []
    for path in sorted((ROOT / "docs" / "ecosystem").glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        for run in data["runs"]:
            found.append((path.name, run["backend"]["name"], {c["id"] for c in run["checks"]}))
    return found


def test_each_stale_report_has_a_banner_naming_the_difference(site: Path) -> None:
    from gptspec.conformance.registry import all_checks

    suite = {c.id for c in all_checks()}
    page = _article(site, "spec/compatibility")
    sections = {s.split("\n", 1)[0]: s for s in page.split("<h3 ")[1:]}
    reports = _ecosystem_reports()
    assert reports and len(sections) >= len(reports)
    problems = []
    for name, _, ids in reports:
        section = next((s for s in sections.values() if f"({name})" in s or name in s), "")
        banner = "gs-stale" in section
        if banner != (ids != suite):
            problems.append(f"{name}: banner {banner}, checks differ {ids != suite}")
        for missing in sorted(suite - ids) + sorted(ids - suite):
            if f"<code>{missing}</code>" not in section:
                problems.append(f"{name}: the banner does not name {missing}")
    assert problems == []
    # the backend guide's saved run of the example is held to the same rule
    import json

    run = json.loads((ROOT / "docs/examples/numpy_backend/run/report.json").read_text())
    ids = {c["id"] for c in run["runs"][0]["checks"]}
    assert ("gs-stale" in _article(site, "backend")) == (ids != suite)


def test_the_backend_guide_states_what_the_saved_runs_measured(site: Path) -> None:
    import json

    sys.path.insert(0, str(ROOT / "docs"))
    from sitegen.example_run import counts_text

    guide = _article(site, "backend")
    run = json.loads((ROOT / "docs/examples/numpy_backend/run/report.json").read_text())
    assert counts_text(run["runs"][0]["checks"]) in guide
    saved = json.loads((ROOT / "docs/mutation-results.json").read_text())["results"]
    killed = sum(1 for r in saved if r.get("killed_by") and r.get("on_target"))
    from meta.mutants import MUTANTS

    assert f"{killed} of {len(MUTANTS)} mutants were killed on target" in guide
    assert "Every mutant in the catalog is killed" not in guide


def test_equation_pages_link_the_equations_they_use(site: Path) -> None:
    uses = {"multi_head_attention": ("scaled_dot_product_attention", "causal_mask",
                                     "merge_heads"),
            "block_pre_ln": ("layer_norm", "multi_head_attention", "ffn_gelu_tanh"),
            "ffn_gelu": ("gelu",)}
    for entry_id, used in uses.items():
        page = _article(site, f"spec/{entry_id}")
        uses_line = page.split('class="gs-uses"', 1)[1].split("</p>", 1)[0]
        for other in used:
            assert f'href="../{other}/"' in uses_line, (entry_id, other)


def test_source_links_are_pinned_to_the_built_commit(site: Path) -> None:
    page = _article(site, "spec/softmax")
    refs = set(re.findall(r"/blob/([^/]+)/src/gptspec/reference/", page))
    assert len(refs) == 1, refs
    ref = refs.pop()
    checkout = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).returncode == 0
    if checkout:  # the commit the site was built from: HEAD then, HEAD or before it now
        assert re.fullmatch(r"[0-9a-f]{40}", ref), ref
        assert subprocess.run(["git", "merge-base", "--is-ancestor", ref, "HEAD"],
                              cwd=ROOT).returncode == 0, ref
    else:
        assert ref == "main"
    # and each cited document links to its place on the Sources page
    sources = page.split('id="sources"', 1)[1].split("</ul>", 1)[0]
    anchors = re.findall(r'href="\.\./\.\./sources/#([^"]+)"', sources)
    assert anchors and all(f'id="{a}"' in (site / "sources" / "index.html").read_text(
        encoding="utf-8") for a in anchors)


def test_the_search_index_holds_no_character_references(site: Path) -> None:
    """The theme shows index text as it is: a reference there reads "amp;" or "lt;"."""
    import json

    docs = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))["docs"]
    leftover = re.compile(r"&(?:[A-Za-z]+|#\d+|#x[0-9a-fA-F]+);|(?<![A-Za-z])(?:amp|lt|gt|quot);")
    found = [f"{d['location']}: {m.group(0)}" for d in docs for key in ("title", "text")
             for m in leftover.finditer(d[key])]
    assert found == [], found[:10]


# Material's own search worker, run by node on the built index, as the browser runs it.
SEARCH_JS = r"""
const fs = require("fs");
const [worker, index, ...queries] = process.argv.slice(2);
let handler = null; const replies = [];
global.self = global;
global.addEventListener = (type, h) => { if (type === "message") handler = h; };
global.postMessage = (m) => replies.push(m);
require(worker);
(async () => {
  const data = JSON.parse(fs.readFileSync(index, "utf8"));
  await handler({data: {type: 0, data: {...data, options: {suggest: false}}}});
  for (const q of queries) await handler({data: {type: 2, data: q}});
  const results = replies.filter(m => m.type === 3);
  console.log(JSON.stringify(results.map(m => m.data.items.map(group => group[0].location))));
})();
"""


def search_ranking(site: Path, queries: list[str], tmp_path: Path) -> dict[str, list[str]]:
    import json
    import shutil

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    script = tmp_path / "search.js"
    script.write_text(SEARCH_JS, encoding="utf-8")
    worker = next((site / "assets" / "javascripts" / "workers").glob("search.*.min.js"))
    done = subprocess.run([node, str(script), str(worker),
                           str(site / "search" / "search_index.json"), *queries],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(zip(queries, json.loads(done.stdout.strip().splitlines()[-1]), strict=True))


def test_search_ranks_the_nucleus_page_first_for_top_p(site: Path, tmp_path: Path) -> None:
    ranked = search_ranking(site, ["top-p", "top p", "nucleus", "softmax"], tmp_path)
    for query in ("top-p", "top p", "nucleus"):
        assert ranked[query][:1] == ["spec/nucleus_filter/"], (query, ranked[query][:5])
    assert ranked["softmax"][:1] != ["spec/nucleus_filter/"]  # the ranking is not fixed


def test_every_budget_lambda_links_to_its_definition(site: Path, entries: list) -> None:
    """λ in a check's budget (entry pages, Verification) and beside a tolerance with λ links
    to the Verification page's definition of it."""
    verification = _article(site, "spec/verification")
    assert 'id="budgets"' in verification
    unlinked, linked = [], 0
    for e in entries:
        page = _article(site, f"spec/{e.id}")
        checks = page.split('class="gs-checks"', 1)[1].split("</table>", 1)[0]
        tolerance = page.split('id="tolerance"', 1)[1].split('class="gs-checks"', 1)[0]
        for section in (checks, tolerance):
            linked += section.count('href="../verification/#budgets">λ</a>')
            # λ_wd (AdamW's weight decay) is another symbol, never the multiplier
            if re.search("λ(?!_)", section.replace('href="../verification/#budgets">λ</a>', "")):
                unlinked.append(e.id)
    assert linked and unlinked == []
    budgets = re.findall(r"<p><small>Budget: (.*?)</small></p>", verification)
    assert budgets and not [b for b in budgets
                            if re.search("λ(?!_)", b.replace('href="#budgets">λ</a>', ""))]


def test_each_entry_states_one_budget_the_one_its_check_computes(site: Path,
                                                                 entries: list) -> None:
    """One normative budget per entry page: the text its own check registers (what the
    check computes and its reports carry), stated once in the Tolerance section; the
    check's row points to it. An entry no check judges on its own shows the spec's
    formula and says so. No budget uses λ for anything but the multiplier."""
    import html

    sys.path.insert(0, str(ROOT / "docs"))
    from sitegen.checks import load_checks_for
    from sitegen.spec_pages import BUDGET_ABOVE, entry_budget, lambda_links

    checks_for, problem = load_checks_for()
    assert not problem
    wrong, judged = [], 0
    for e in entries:
        page = _article(site, f"spec/{e.id}")
        tolerance = page.split('id="tolerance"', 1)[1].split('id="conformance-checks"', 1)[0]
        rows = page.split('class="gs-checks"', 1)[1].split("</table>", 1)[0] \
            if 'class="gs-checks"' in page else ""
        if tolerance.count('class="gs-budget"') > 1:
            wrong.append(f"{e.id}: more than one budget")
        normative = entry_budget(e.id, checks_for(e.id))
        if normative is None:
            continue
        judged += 1
        stated = lambda_links(html.escape(normative.budget, quote=True))
        if stated not in tolerance or f"<code>{normative.id}</code>" not in tolerance:
            wrong.append(f"{e.id}: the Tolerance section does not state {normative.id}'s budget")
        if stated in rows or BUDGET_ABOVE not in rows:
            wrong.append(f"{e.id}: the checks table states the entry's budget again")
    assert judged > 30 and wrong == []
    from gptspec.conformance.registry import all_checks

    # λ as the multiplier and as something else in one formula (AdamW's weight decay was)
    assert not [c.id for c in all_checks() if re.search(r"[+(·]\s*λ\s*\|", c.budget)]


MATH = re.compile(r'class="arithmatex">(.*?)</(?:span|div)>', re.DOTALL)
# One glyph per symbol in the site's mathematics (docs/notation.md): ε is \varepsilon, the
# head width d_k (the Notes' d_H and GPT-3's d_head appear only in the crosswalk), a sum
# over the vocabulary runs over the ids 0…V−1, and positions are 1-based inclusive ranges.
OTHER_GLYPHS = {
    "ϵ (\\epsilon) for ε": re.compile(r"(?<!var)\\epsilon|ϵ"),
    "d_H or d_head for d_k": re.compile(r"d_\{?H\}?(?![a-z])|d_\{\\(?:text|mathrm)\{head\}\}"),
    "a vocabulary sum from 1": re.compile(r"\\sum_\{[a-z]\s*=\s*1\}\^\{?V\}?"),
    "a Python slice of positions": re.compile(r"\[0\s*\{?:\}?"),
    "an italic size name (d_model, d_ff, n_ctx are upright)": re.compile(
        r"[dn]_\{(?:model|ff|ctx)\}"),
}


def notation_problems(site: Path) -> list[str]:
    """Each math span of the site's pages in another glyph than Notation's, the notation
    page's crosswalk of the documents' own conventions excepted; and each head-sliced
    parameter (W_Q^{(i)}) in an entry's equation that its symbols table does not define."""
    found = []
    for path in sorted(site.rglob("index.html")):
        page = path.read_text(encoding="utf-8")
        if "<article" not in page:
            continue
        article = page.split("<article", 1)[1].split("</article>", 1)[0]
        if path.parent.name == "notation":
            article = re.sub(r'<h2 id="how-each-documents.*?(?=<h2 )', "", article, flags=re.S)
        for m in MATH.finditer(article):
            found += [f"{path.parent.relative_to(site)}: {what}: {m.group(1)[:80]}"
                      for what, pattern in OTHER_GLYPHS.items() if pattern.search(m.group(1))]
        if 'class="gs-equation"' in article:
            equation = article.split('class="gs-equation"', 1)[1].split("</div>\n</div>", 1)[0]
            symbols = article.split("<strong>Symbols</strong>", 1)[1].split("</table>", 1)[0]
            for m in re.finditer(r"\b[Wb]_\{?[A-Za-z]+\}?\^\{\([a-z]\)\}", equation):
                if m.group(0) not in symbols:
                    found.append(f"{path.parent.relative_to(site)}: {m.group(0)} undefined")
    return found


def test_the_site_writes_one_notation(site: Path, tmp_path: Path) -> None:
    assert notation_problems(site) == []
    # the scan finds each thing it looks for
    page = tmp_path / "spec" / "made_up" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text(
        '<article><div class="gs-equation">\n<div class="arithmatex">\\[y = H W_Q^{(i)}'
        '\\]</div>\n</div><p><strong>Symbols</strong></p><table><tr><td>H</td></tr></table>'
        '<span class="arithmatex">\\(\\sqrt{\\sigma^2 + \\epsilon}\\)</span>'
        '<span class="arithmatex">\\(h\\,d_H\\)</span>'
        '<span class="arithmatex">\\(\\sum_{j=1}^{V} e^{z_j}\\)</span>'
        '<span class="arithmatex">\\(W_P[0{:}T]\\)</span>'
        '<span class="arithmatex">\\(\\sqrt{d_{ff}}\\)</span></article>')
    assert len(notation_problems(tmp_path)) == 6


def test_the_generation_guide_writes_temperature_as_tau(site: Path) -> None:
    """T is the sequence length everywhere; the temperature is τ (as in the spec)."""
    guide = _article(site, "generation")
    row = guide.split("<code>--temperature", 1)[1].split("</tr>", 1)[0]
    assert "\\tau" in row and "\\(T\\)" not in row
    # and wherever the guide divides the logits by the temperature
    divisors = re.findall(r"\\text\{logits\}\s*/\s*(\\?\w+)", guide)
    assert divisors and set(divisors) == {"\\tau"}, divisors


def test_the_guides_write_the_head_width_d_k(site: Path) -> None:
    """The guides' prose names the head width as the equations do, d_k (the Notes' d_H
    and GPT-3's d_head only in Notation's crosswalk; ``config.d_head`` is code). The model
    page and the tables generated from gptspec.spec.config are not read yet."""
    wrong = []
    for page in GUIDES:
        if page == "model/":  # its presets' decisions (gptspec.spec.config) still say d_H
            continue
        article = _article(site, page.rstrip("/") or ".")
        if page == "notation/":
            article = re.sub(r'<h2 id="how-each-documents.*?(?=<h2 )', "", article, flags=re.S)
        # its paragraphs and lists (the tables read from gptspec.spec.config's comments)
        prose = re.sub(r"<code>.*?</code>|<pre.*?</pre>|<table.*?</table>", "", article,
                       flags=re.S)
        wrong += [f"{page or 'home'}: {m.group(0)}"
                  for m in re.finditer(r"\bd_H\b|\bd_\{?H\}?(?![a-z])", prose)]
    assert wrong == []


def test_losses_are_in_one_unit_and_each_answer_reads_one_evaluation(site: Path) -> None:
    """Figures and Open questions give losses in bits per byte; the head-width answer leads
    with the like-for-like arms (h·d_k = d_model, same width and steps); each learning-curve
    figure says what the curves measure beside the whole split the answer reads, and names
    any pair of arms the two rank differently."""
    figures, questions = _article(site, "figures"), _article(site, "open-questions")
    for page in (figures, questions):
        assert "bits per byte" in page and "nats" not in page
    head_width = questions.split('id="head-width"', 1)[1]
    answer = head_width.split("<strong>Answer.</strong>", 1)[1].split("</p>", 1)[0]
    assert answer.strip().startswith("Like for like")
    assert answer.index("Like for like") < answer.index("free of d_model")
    for study in ("vocab", "tying", "head-width"):
        after = questions.split(f"experiments/{study}-curves.svg", 1)[1]
        caption = after.split('class="gs-caption"', 1)[1].split("</p>", 1)[0]
        assert "whole split" in caption and "windows" in caption
        assert ("rank" in caption and "differently" in caption) or "as the whole split" in caption


# A named quantity of an equation: a Latin capital or a Greek letter, with its subscript
# (lower-case letters are indices and scalars, which Notation lets go without a row).
QUANTITY = re.compile(r"(?<![\\a-zA-Z])([A-Z]|\\(?:alpha|beta|gamma|delta|varepsilon|eta|"
                      r"theta|lambda|mu|sigma|tau|kappa|rho|phi|psi|omega))"
                      r"(?:_\{?([A-Za-z0-9]+)\}?)?")
# defined once for every page, on Notation: the sizes and the parameters' names
NOTATION_WIDE = {"V": "V", "T": "T", "B": "B", "L": "L", "W_E": "W_E", "W_P": "W_P",
                 "W_U": "W_U", "b_U": "b_U", "W_Q": "W_Q", "W_K": "W_K", "W_V": "W_V",
                 "W_O": "W_O", "W_1": "W_1", "W_2": "W_2", "H": "H \\in"}


def quantities(latex: str) -> set[str]:
    latex = re.sub(r"\\(?:operatorname|mathrm|text|mathcal|mathbb)\{[^{}]*\}", " ", latex)
    return {m.group(1) + (f"_{m.group(2)}" if m.group(2) else "")
            for m in QUANTITY.finditer(latex)}


def undefined_quantities(site: Path) -> list[str]:
    """Each quantity of an entry's equation that neither its symbols table nor Notation
    defines; σ_1 counts as defined by a row for σ_i (one index of it)."""
    found = []
    for path in sorted((site / "spec").glob("*/index.html")):
        article = path.read_text(encoding="utf-8").split("<article", 1)[1]
        if 'class="gs-equation"' not in article:
            continue
        equation = article.split('class="gs-equation"', 1)[1].split("</div>\n</div>", 1)[0]
        table = article.split("<strong>Symbols</strong>", 1)[1].split("</table>", 1)[0]
        defined = set().union(*(quantities(m.group(1)) for m in MATH.finditer(table)))
        bases = {d.split("_")[0] for d in defined}
        for q in sorted(quantities(html_unescape(equation))):
            if q not in defined and q not in NOTATION_WIDE and q.split("_")[0] not in bases:
                found.append(f"{path.parent.name}: {q}")
    return found


def html_unescape(text: str) -> str:
    import html

    return html.unescape(text)


def test_every_quantity_in_an_equation_is_defined(site: Path, tmp_path: Path) -> None:
    assert undefined_quantities(site) == []
    notation = _article(site, "notation")
    assert not [q for q, shown in NOTATION_WIDE.items() if shown not in notation]
    # the scan finds what it looks for
    page = tmp_path / "spec" / "made_up" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text('<article><div class="gs-equation">\n<div class="arithmatex">\\[Y = '
                    '\\gamma\\,G_Q X + \\sigma_1 + \\operatorname{Concat}(W_E)\\]</div>\n</div>'
                    '<p><strong>Symbols</strong></p><table><tr><td><span class="arithmatex">'
                    '\\(X\\)</span></td><td><span class="arithmatex">\\(\\sigma_i\\)</span>'
                    "</td></tr></table></article>")
    assert undefined_quantities(tmp_path) == ["made_up: G_Q", "made_up: Y", "made_up: \\gamma"]


def test_the_verification_page_counts_the_soundness_gate_as_its_ledger_does(site: Path) -> None:
    """The gate's standing, as `python -m meta.soundness.gate --ledger` prints it for the
    judge as it is now, line for line."""
    import html

    from meta.soundness.gate import ledger_summary

    page = html.unescape(_article(site, "spec/verification"))
    assert 'id="soundness"' in _article(site, "spec/verification")
    ledger = ROOT / "meta" / "soundness" / "ledger.jsonl"
    if not ledger.exists():
        assert "No ledger was found" in page
        return
    for line in ledger_summary(ledger)[0].splitlines():
        assert line in page, line
