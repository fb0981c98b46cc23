"""What each spec page states agrees with itself: the symbols table and the LaTeX name the
same quantities, and the table's shapes are those of the sympy form's inputs.

A LaTeX formula is read as a list of *atoms*: a letter (Latin, Greek, or \\mathcal{X})
or a named quantity (\\mathrm{head}) with its subscript, e.g. ``W_Q``, ``d_model``,
``x_t``. An atom is *covered* by the table when the table lists it (``W_Q``), or lists
its base and the subscript is an index into it (``z_i`` with ``z`` listed; the index's
own letters must then be covered too). What needs no row, because the Notation page
defines it once for every entry:

- the configuration's sizes (T, V, B, d, d_model, L, h, d_k, d_v, d_ff, n_ctx);
- the index letters i, j (rows, columns, heads), t (a position), v (a vocabulary entry),
  l (a block), and any letter a sum, min, max or set-builder binds;
- functions and operators (\\operatorname{…}, \\text{…}, \\exp, …), e in e^{…}, π in a
  formula whose table does not use π, and L of ∂L (the loss).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from gptspec.spec import REGISTRY

SIZES = {"T", "V", "B", "d", "d_model", "L", "h", "d_k", "d_v", "d_ff", "n_ctx"}
INDEX_LETTERS = {"i", "j", "t", "v", "l"}
GREEK = {
    "alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta",
    "iota", "kappa", "lambda", "mu", "nu", "xi", "pi", "rho", "sigma", "tau", "upsilon",
    "phi", "varphi", "chi", "psi", "omega", "Gamma", "Delta", "Theta", "Lambda", "Xi", "Pi",
    "Sigma", "Phi", "Psi", "Omega",
}
# Commands whose braced argument names a function or is prose, not a quantity.
NAME_COMMANDS = {"operatorname", "operatorname*", "text", "texttt", "textstyle", "mathbf",
                 "mathbb", "boldsymbol"}
SYMBOL_COMMANDS = {"mathcal", "mathrm", "hat", "bar", "tilde", "overline"}
BINDERS = {"sum", "prod", "min", "max", "bigcup", "mathop"}


@dataclass(frozen=True)
class Atom:
    base: str  # "W", "\\gamma", "\\mathcal{L}", "head"
    sub: str  # normalised subscript text, "" if none
    sub_atoms: tuple[Atom, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.base}_{self.sub}" if self.sub else self.base


def _normalise(text: str) -> str:
    """Subscript text without spacing or font commands: d_{\\mathrm{model}} → model."""
    text = re.sub(r"\\(?:mathrm|text|mathit|operatorname)\{([^{}]*)\}", r"\1", text)
    text = re.sub(r"\\[,;:! ]|\\left|\\right|\\big|\\Big|\s+", "", text)
    return text.strip("{}")


def _group(src: str, i: int) -> tuple[str, int]:
    """The braced group (or single token) starting at src[i]; (text, index after it)."""
    while i < len(src) and src[i] == " ":
        i += 1
    if i >= len(src):
        return "", i
    if src[i] == "{":
        depth, j = 0, i
        while j < len(src):
            depth += {"{": 1, "}": -1}.get(src[j], 0)
            if depth == 0:
                return src[i + 1:j], j + 1
            j += 1
        return src[i + 1:], len(src)
    if src[i] == "\\":
        m = re.match(r"\\([A-Za-z]+\*?|.)", src[i:])
        assert m
        return m.group(0), i + len(m.group(0))
    return src[i], i + 1


def atoms(src: str) -> list[Atom]:
    """Every quantity a LaTeX formula names, in order (operators and prose left out)."""
    out: list[Atom] = []
    i = 0
    last: Atom | None = None  # the atom a following _ or ^ attaches to
    while i < len(src):
        c = src[i]
        if c == "\\":
            m = re.match(r"\\([A-Za-z]+\*?|.)", src[i:])
            assert m
            name, i = m.group(1), i + len(m.group(0))
            if name in NAME_COMMANDS or name in SYMBOL_COMMANDS:
                arg, i = _group(src, i)
                if name in SYMBOL_COMMANDS:
                    base = f"\\mathcal{{{arg}}}" if name == "mathcal" else _normalise(arg)
                    if name in ("hat", "bar", "tilde", "overline"):
                        inner = atoms(arg)
                        out.extend(inner)
                        last = inner[-1] if inner else None
                        continue
                    last = Atom(base, "")
                    out.append(last)
                else:
                    last = None
                continue
            if name in ("begin", "end"):  # an environment's name: cases, pmatrix, aligned
                _, i = _group(src, i)
                last = None
                continue
            if name in GREEK:
                last = Atom(f"\\{name}", "")
                out.append(last)
                continue
            last = None  # \frac, \sqrt, \sum, \left, \cdot, … are structure
            continue
        if c in "_^":
            arg, i = _group(src, i + 1)
            if c == "_":
                inner = tuple(atoms(arg))
                if last is not None and not last.sub:
                    out[out.index(last)] = last = Atom(last.base, _normalise(arg), inner)
                else:  # an index on a bracket: (W_E)_{x_t,:}, softmax(z)_i
                    out.extend(inner)
            elif arg.startswith("{(") or arg.startswith("("):
                pass  # H^{(l)}, X^{(i)}: the same quantity at a layer or head
            else:
                out.extend(a for a in atoms(arg) if a.base != "top")
            continue
        if c.isalpha():
            last = Atom(c, "")
            out.append(last)
        elif c not in " {}":
            last = None
        i += 1
    return out


def bound_letters(src: str) -> set[str]:
    """Letters bound by a sum, min, max or set-builder in the formula."""
    found = set()
    for m in re.finditer(r"\\(?:" + "|".join(BINDERS) + r")\*?(?:_\{?|\\\{|\\Big\\\{|"
                         r"\\big\\\{)\s*(?:\\,)?\s*([A-Za-z])\b", src):
        found.add(m.group(1))
    for m in re.finditer(r"\\\{\s*(?:\\,)?\s*([A-Za-z])\s*:", src):
        found.add(m.group(1))
    return found


def _is_family(a: Atom) -> bool:
    """``head_i``, ``x_t``, ``x_{1:T}`` in a table name a whole indexed family."""
    return a.sub in INDEX_LETTERS or ":" in a.sub


def _keys(symbol_names: list[str]) -> set[str]:
    keys = set()
    for name in symbol_names:
        keys |= {a.base if _is_family(a) else a.key for a in atoms(name)}
    return keys


def _free(src: str) -> list[Atom]:
    """The atoms of a formula minus e of e^{…} and L of ∂L (they are notation)."""
    src = re.sub(r"\\partial\s*(?:\\bar\{\\mathcal\{L\}\}|\\mathcal\{L\}|L)\b", r"\\partial", src)
    src = re.sub(r"(?<![A-Za-z\\])e\^", "", src)
    return atoms(src)


def problems(entry) -> list[str]:
    names = [s.name for s in entry.symbols]
    table = _keys(names)
    used = _free(entry.latex)
    used_keys = {a.key for a in used} | {a.base for a in used}
    for a in used:
        used_keys |= {s.key for s in a.sub_atoms} | {s.base for s in a.sub_atoms}
    out = []
    for name in names:
        missing = [a.key for a in atoms(name)
                   if a.key not in used_keys and not (_is_family(a) and a.base in used_keys)]
        if missing:
            out.append(f"table lists {name!r}, which the LaTeX does not use ({missing})")
    shape_sizes = {w for s in entry.symbols for w in re.findall(r"[A-Za-z_]+", s.shape)}
    free = SIZES | INDEX_LETTERS | bound_letters(entry.latex) | table | shape_sizes
    if r"\pi" not in table:
        free.add(r"\pi")

    def uncovered(a: Atom) -> list[str]:
        if a.key in free:
            return []
        if a.base in free and a.sub:  # an index into a listed quantity
            return [k for s in a.sub_atoms for k in uncovered(s)]
        return [a.key]

    missing = sorted({k for a in used for k in uncovered(a)})
    if missing:
        out.append(f"the LaTeX uses {missing}, which the table does not list")
    return out


# --- shapes --------------------------------------------------------------------------------

SIZE_WORDS = {"d": "d_model", "f": "d_ff", "k": "d_k"}


def _shape(text: str) -> tuple[str, ...] | None:
    """A shape's sizes, ``(n,)`` read as the row ``(1, n)``; None if it is not a shape."""
    m = re.match(r"\s*\(([^()]*)\)", text)
    if not m:
        return None
    dims = [re.sub(r"\s*\*\s*|\s+", " ", d).strip() for d in m.group(1).split(",")]
    # the sympy form abbreviates the sizes: (d, 3 * d) is (d_model, 3 d_model)
    dims = [re.sub(r"[A-Za-z_]+", lambda w: SIZE_WORDS.get(w.group(0), w.group(0)), d)
            for d in dims if d]
    return tuple(["1", *dims] if len(dims) == 1 else dims)


def _plain(name: str) -> str:
    return re.sub(r"[\\{}]", "", name).replace("mathrm", "")


def shape_problems(entry) -> list[str]:
    inputs = {_plain(n): s for n, s in entry.sympy_inputs}
    out = []
    for s in entry.symbols:
        given = inputs.get(_plain(s.name))
        if given is None or _shape(given) is None or _shape(s.shape) is None:
            continue
        if _shape(given) != _shape(s.shape):
            out.append(f"{s.name!r} has shape {s.shape} in the table but {given} in the "
                       "sympy form's inputs")
    return out


@pytest.mark.parametrize("entry", list(REGISTRY), ids=lambda e: e.id)
def test_symbols_table_latex_and_shapes_agree(entry) -> None:
    found = problems(entry) + shape_problems(entry)
    assert not found, f"{entry.id}: " + "; ".join(found)


def _fake(latex: str, symbols: tuple, inputs: tuple = ()) -> object:
    from gptspec.spec.equation import Symbol

    return SimpleNamespace(id="fake", latex=latex, sympy_inputs=inputs,
                           symbols=tuple(Symbol(n, shape, "") for n, shape in symbols))


def test_the_checks_catch_the_slips_the_issue_found() -> None:
    # cross_entropy_sum as it was: the LaTeX's x_t, P_θ and corpus; the table's Z and Y
    was = _fake(r"\mathcal{L}(\theta) = -\sum_{X \in \mathcal{D}} \sum_{t=1}^{T} "
                r"\log P_\theta(x_t \mid x_{<t})", (("Z", "(T, V)"), ("Y", "(T, V)")))
    found = " ".join(problems(was))
    assert "'Z'" in found and "'Y'" in found and "'x_t'" in found
    # a head's block given the shape of all heads, against the sympy form's input
    assert shape_problems(_fake("Y = X", (("X", "(h, T, d_k)"), ("Y", "(T, d_k)")),
                                (("X", "(T, d_k)"),)))
    # a table row the equation never writes (block_guide's p and H_out)
    assert problems(_fake(r"H^{(l+1)} = \operatorname{LN}(H^{(l)})",
                          (("H", "(T, d)"), ("p", "params"), (r"H_{\mathrm{out}}", "(T, d)"))))
    # and a consistent entry passes: sums' indices, sizes and e^ need no row
    assert not problems(_fake(r"\operatorname{softmax}(z)_i = \frac{e^{z_i}}"
                              r"{\sum_{j=1}^{n} e^{z_j}}", (("z", "(m, n)"),)))
