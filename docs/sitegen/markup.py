"""HTML fragments for math, tables and code on generated pages.

Math is written as pymdownx.arithmatex's generic output (``\\(…\\)`` inside
``.arithmatex``), which the KaTeX auto-render script typesets in the browser. It is
emitted as raw HTML rather than Markdown because Markdown would eat the backslashes
and a ``|`` in LaTeX would split a table cell.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence

# An absolute path on the machine that produced some saved data: a home, a checkout, an
# interpreter's folder. It says nothing to a reader and names someone's machine.
MACHINE_PATH = re.compile(r"(?<![\w.])(?:/(?:root|home|Users|tmp|work|usr|opt|var|private)"
                          r"|[A-Za-z]:\\(?:Users|Program Files)?)(?:[/\\][^\s/\\()<>\"',;]+)+")


def esc(text: str) -> str:
    return html.escape(str(text), quote=True)


def public_text(text: str) -> str:
    """Saved text with each machine path cut to its last two parts: "(/root/.pyenv/versions/
    3.11.7/lib/python3.11)" reads "(…/lib/python3.11)"."""
    def shorten(match: re.Match[str]) -> str:
        parts = [p for p in re.split(r"[/\\]", match.group(0)) if p]
        return "…/" + "/".join(parts[-2:])

    return MACHINE_PATH.sub(shorten, text)


def inline_math(latex: str) -> str:
    return f'<span class="arithmatex">\\({esc(latex)}\\)</span>'


def markdown_math(latex: str) -> str:
    """Inline math inside Markdown text (arithmatex reads it before Markdown's escapes)."""
    return f"\\({latex}\\)"


def display_math(latex: str) -> str:
    return f'<div class="arithmatex">\\[{esc(latex)}\\]</div>'


def code(text: str) -> str:
    return f"<code>{esc(text)}</code>"


def link(href: str, text: str) -> str:
    return f'<a href="{esc(href)}">{esc(text)}</a>'


def table(header: Sequence[str], rows: Iterable[Sequence[str]], css_class: str = "") -> str:
    """An HTML table; cells are HTML already (escape text with :func:`esc`).

    Written on as few lines as possible and with no blank line, so that Markdown keeps
    it as one raw HTML block."""
    # Material styles only tables without a class; a class goes on a wrapping div.
    wrap = f'<div class="{css_class}">' if css_class else "<div>"
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join(
        "\n<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows
    )
    return (f'{wrap}<div class="md-typeset__scrollwrap"><div class="md-typeset__table"><table>'
            f"\n<thead><tr>{head}</tr></thead>\n<tbody>{body}\n</tbody>\n</table></div></div>"
            "</div>\n")


def fenced(source: str, language: str = "python") -> str:
    return f"```{language}\n{source.rstrip()}\n```\n"
