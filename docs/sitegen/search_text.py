"""Readable search snippets: the search index's text with its TeX turned into plain text.

The pages keep their TeX (KaTeX renders it in the browser), but the search plugin indexes
the HTML's text, where a formula is raw source: ``\\(\\frac{QK^\\top}{\\sqrt{d_k}}\\)``. After
the build, :func:`rewrite_index` replaces every ``\\(…\\)`` and ``\\[…\\]`` in
``search/search_index.json`` with a plain reading of it, ``(QKᵀ)/(√(d_k))``, so that
results show text a reader can scan, and writes its character references as characters
(:func:`without_entities`). Only the index changes; the pages are untouched.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

SYMBOLS = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "varepsilon": "ε",
    "zeta": "ζ", "eta": "η", "theta": "θ", "kappa": "κ", "lambda": "λ", "mu": "μ", "nu": "ν",
    "xi": "ξ", "pi": "π", "rho": "ρ", "sigma": "σ", "tau": "τ", "phi": "φ", "varphi": "φ",
    "chi": "χ", "psi": "ψ", "omega": "ω", "Gamma": "Γ", "Delta": "Δ", "Theta": "Θ",
    "Lambda": "Λ", "Sigma": "Σ", "Phi": "Φ", "Psi": "Ψ", "Omega": "Ω", "Pi": "Π",
    "cdot": "·", "times": "×", "odot": "⊙", "otimes": "⊗", "oplus": "⊕", "le": "≤", "leq": "≤",
    "ge": "≥", "geq": "≥", "ne": "≠", "neq": "≠", "approx": "≈", "to": "→", "rightarrow": "→",
    "leftarrow": "←", "mapsto": "↦", "infty": "∞", "sum": "Σ", "prod": "Π", "partial": "∂",
    "in": "∈", "notin": "∉", "cup": "∪", "cap": "∩", "mid": "|", "Vert": "‖", "lVert": "‖",
    "rVert": "‖", "vert": "|", "lvert": "|", "rvert": "|", "ldots": "…", "dots": "…",
    "cdots": "…", "vdots": "⋮", "top": "ᵀ", "nabla": "∇", "sim": "∼", "lor": "∨", "land": "∧",
    "iff": "⇔", "implies": "⇒", "forall": "∀", "exists": "∃", "langle": "⟨", "rangle": "⟩",
    "lfloor": "⌊", "rfloor": "⌋", "lceil": "⌈", "rceil": "⌉", "emptyset": "∅", "pm": "±",
    "{": "{", "}": "}", "%": "%", "_": "_", "&": "&",
}
# Commands whose braced argument is shown as it is (a name, a word, a font).
PLAIN = ("operatorname*", "operatorname", "text", "textrm", "textit", "texttt", "mathrm",
         "mathcal", "mathbf", "mathbb", "mathit", "boldsymbol", "mathop")
# Accents over one letter, as combining characters: x̂, L̄, x̃.
ACCENTS = {"hat": "\u0302", "widehat": "\u0302", "bar": "\u0304", "overline": "\u0304",
           "tilde": "\u0303"}
SPACING = re.compile(r"\\(?:[,;:! ]|q?quad)|\\(?:left|right|big|Big|bigg|Bigg)[lr]?\b|"
                     r"\\(?:displaystyle|textstyle|limits|nolimits)\b|&|\\\\")
MATH = re.compile(r"\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S)


def _group(src: str, i: int) -> tuple[str, int]:
    """The braced group at src[i] (or the one character there): (its text, index after)."""
    if i < len(src) and src[i] == "{":
        depth = 0
        for j in range(i, len(src)):
            depth += {"{": 1, "}": -1}.get(src[j], 0)
            if depth == 0:
                return src[i + 1:j], j + 1
        return src[i + 1:], len(src)
    m = re.match(r"\\([A-Za-z]+|.)", src[i:])
    if m:  # a command is one token: K^\top
        return m.group(0), i + len(m.group(0))
    return (src[i], i + 1) if i < len(src) else ("", i)


def _wrapped(text: str) -> str:
    """A fraction's part in parentheses only where it has more than one term."""
    simple = re.fullmatch(r"[\w.√ᵀ]+(?:[_^](?:\{[^{}]*\}|\w))*|√\([^()]*\)", text)
    return text if simple else f"({text})"


def tex_to_text(tex: str) -> str:
    """A plain reading of a TeX formula: fractions as (a)/(b), roots as √(a), Greek letters
    and operators as their characters, names without their commands."""
    src = SPACING.sub(" ", tex)
    src = re.sub(r"\\(?:begin|end)\{[a-z*]+\}", " ", src)
    out: list[str] = []
    i = 0
    while i < len(src):
        c = src[i]
        if c == "\\":
            m = re.match(r"\\([A-Za-z]+\*?|.)", src[i:])
            name = m.group(1) if m else ""
            i += len(name) + 1
            if name in ("frac", "tfrac", "dfrac"):
                num, i = _group(src, i)
                den, i = _group(src, i)
                out.append(f"{_wrapped(tex_to_text(num))}/{_wrapped(tex_to_text(den))}")
            elif name == "sqrt":
                arg, i = _group(src, i)
                out.append("√" + _wrapped(tex_to_text(arg)))
            elif name in ACCENTS:
                arg, i = _group(src, i)
                text = tex_to_text(arg)
                out.append(text + ACCENTS[name] if len(text) == 1 else text)
            elif name in PLAIN:
                arg, i = _group(src, i)
                out.append(tex_to_text(arg))
            else:
                out.append(SYMBOLS.get(name, name))
        elif c in "^_":
            arg, i = _group(src, i + 1)
            text = tex_to_text(arg)
            out.append("ᵀ" if text == "ᵀ" else c + (text if len(text) <= 1 else f"{{{text}}}"))
        elif c in "{}":
            i += 1
        else:
            out.append(c)
            i += 1
    return re.sub(r"\s+", " ", "".join(out)).strip()


def readable(text: str) -> str:
    """Text with every inline or display formula replaced by its plain reading."""
    # the index holds HTML: the TeX's "&" and "<" arrive as "&amp;" and "&lt;" (read as
    # characters, not as spacing), and its reading goes back as HTML
    return MATH.sub(lambda m: html.escape(tex_to_text(html.unescape(m.group(1) or m.group(2))),
                                          quote=False), text)


TAG_OR_TEXT = re.compile(r"(<[^<>]*>)|([^<]+)")
ENTITY_LIKE = re.compile(r"&(?=[A-Za-z#][A-Za-z0-9]*;)")


def without_entities(markup: str) -> str:
    """The index's HTML with its text's character references written as characters.

    The theme shows a snippet's text from the index, escaped once more where it highlights
    a match, so "&amp;" and "&lt;" came out as "amp;" and "lt;". Tags are kept (a snippet
    shows code as code); in the text between them ``<`` and ``>`` become ‹ and ›, which no
    HTML reader takes for a tag, and an ``&`` that would read as a reference becomes ＆."""
    def text(match: re.Match[str]) -> str:
        if match.group(1):
            return match.group(1)
        plain = html.unescape(match.group(2))
        plain = plain.replace("<", "‹").replace(">", "›")
        return ENTITY_LIKE.sub("＆", plain)

    return TAG_OR_TEXT.sub(text, markup)


def rewrite_index(path: Path) -> int:
    """Rewrite a search index in place; returns how many documents changed."""
    data = json.loads(path.read_text(encoding="utf-8"))
    changed = 0
    for doc in data.get("docs", []):
        for key in ("title", "text"):
            if isinstance(doc.get(key), str):
                new = without_entities(readable(doc[key]))
                changed += new != doc[key]
                doc[key] = new
    path.write_text(json.dumps(data, ensure_ascii=False, separators=(",", ":")),
                    encoding="utf-8")
    return changed
