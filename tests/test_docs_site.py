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
