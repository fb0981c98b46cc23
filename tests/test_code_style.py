"""Concise prose in code: no module docstring under src/gptspec or meta/ runs over
MAX_DOCSTRING_LINES lines. A module docstring says what the module is for and the key why;
longer design notes go to ARCHITECTURE.md, measurements to the benchmarks and the docs."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOTS = (ROOT / "src" / "gptspec", ROOT / "meta")
MAX_DOCSTRING_LINES = 12


def docstring_lines(path: Path) -> int:
    """The module docstring's length in lines, every line of its text counted (the line
    that closes it included when the closing quotes stand alone); 0 when it has none."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
    return doc.count("\n") + 1 if doc else 0


def long_docstrings(*roots: Path, base: Path = ROOT, limit: int = MAX_DOCSTRING_LINES) -> list[str]:
    """'path: N lines' (path from base) for each module under the roots whose docstring
    exceeds the limit."""
    return [f"{path.relative_to(base).as_posix()}: {n} lines"
            for root in roots for path in sorted(root.rglob("*.py"))
            if (n := docstring_lines(path)) > limit]


def test_no_module_docstring_is_over_twelve_lines():
    assert sum(1 for root in ROOTS for _ in root.rglob("*.py")) > 50  # the scan reads the code
    long = long_docstrings(*ROOTS)
    assert not long, (f"module docstrings over {MAX_DOCSTRING_LINES} lines (say it shorter; "
                      "design notes to ARCHITECTURE.md):\n" + "\n".join(long))


def test_a_planted_long_docstring_is_named_with_its_length(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    body = "\n".join(f"line {i}" for i in range(2, 13))
    (package / "fits.py").write_text(f'"""Title.\n{body}"""\n\nX = 1\n')  # exactly 12 lines
    (package / "long.py").write_text(f'"""Title.\n{body}\nline 13\n"""\n\nX = 1\n')
    (package / "none.py").write_text("X = 1\n")
    assert docstring_lines(package / "fits.py") == 12
    assert docstring_lines(package / "none.py") == 0
    assert long_docstrings(package, base=tmp_path) == ["pkg/long.py: 14 lines"]
