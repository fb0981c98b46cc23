"""Every LaTeX string in the spec parses with KaTeX — the code that renders it on the site.

KaTeX is installed from the npm registry into .cache/katex (the same pinned version the
site ships) and run with node; rendering with throwOnError makes any parse error fail.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))

from sitegen.katex import parse_errors  # noqa: E402
from sitegen.spec_pages import looks_like_latex  # noqa: E402

# Math inside prose, as arithmatex finds it: $…$ (not $$) or \(…\).
INLINE = re.compile(r"(?<![\\$])\$(?!\$)(.+?)(?<![\\$])\$|\\\((.+?)\\\)")


def inline_math(where: str, text: str) -> list[tuple[str, bool, str]]:
    return [(where, False, m.group(1) or m.group(2)) for m in INLINE.finditer(text)]


def spec_latex() -> list[tuple[str, bool, str]]:
    """(where, display mode, LaTeX) for every string the site typesets from the spec."""
    from gptspec.spec import REGISTRY

    found = []
    for e in REGISTRY:
        found.append((f"{e.id}.latex", True, e.latex))
        found += [(f"{e.id}.symbols[{s.name!r}]", False, s.name) for s in e.symbols]
        found += inline_math(f"{e.id}.notes", e.notes)
        if e.tolerance is not None:
            found.append((f"{e.id}.tolerance", False, e.tolerance.formula))
            found += inline_math(f"{e.id}.tolerance.note", e.tolerance.note)
        for d in e.decisions:
            for field in ("question", "decision", "why"):
                found += inline_math(f"{e.id}.decision {field}", getattr(d, field))
            for r in d.readings:
                where = f"{e.id}.decision reading ({str(r.source)[:30]}…)"
                found += ([(where, False, r.reading)] if looks_like_latex(r.reading)
                          else inline_math(where, r.reading))
    return found


def test_every_latex_string_in_the_spec_parses() -> None:
    strings = spec_latex()
    assert strings, "the spec registry has no entries"
    errors = parse_errors([(display, tex) for _, display, tex in strings], ROOT)
    bad = [f"{where}: {tex!r}: {err}" for (where, _, tex), err in zip(strings, errors, strict=True)
           if err is not None]
    assert not bad, "\n".join(bad)


def test_the_parser_rejects_broken_latex() -> None:
    errors = parse_errors([(True, r"\frac{a"), (False, r"\notacommand x"),
                           (False, r"\left( x"), (True, r"\frac{e^{z_i}}{\sum_j e^{z_j}}")], ROOT)
    assert [e is None for e in errors] == [False, False, False, True]
    assert "notacommand" in errors[1]


def test_math_inside_prose_is_found() -> None:
    text = r"with $\sqrt{n}$ and \(a_b\), then $x^2$; a lone \$ is text"
    assert [t for _, _, t in inline_math("x", text)] == [r"\sqrt{n}", "a_b", "x^2"]
