"""Every spec entry is well-formed, and entries and reference functions pair up by name
(the spec ↔ reference half of the traceability test; the conformance half lives with the
conformance suite)."""

from __future__ import annotations

import inspect
import re

import pytest

from gptspec import reference
from gptspec.reference import attention, block, embedding, output
from gptspec.spec import GROUPS, REGISTRY, Decision, Equation, sources
from gptspec.spec.sources import BLUEPRINT, DOCUMENTS, GUIDE, NOTES, Source

KNOWN_SOURCES = {value for name, value in vars(sources).items()
                 if name.isupper() and isinstance(value, str)}
FORWARD_GROUPS = ("embedding", "attention", "block", "output")
# A tolerance's reduction is a size of the model, or a product of sizes ("T * V"), or "1"
# for none: something a budget can be evaluated from.
REDUCTION = re.compile(r"1|[A-Za-z_][A-Za-z0-9_]*(\s*\*\s*[A-Za-z_][A-Za-z0-9_]*)*")

ENTRIES = list(REGISTRY)


def entry_ids(entries: list[Equation]) -> list[str]:
    return [e.id for e in entries]


def latex_problems(latex: str) -> list[str]:
    """What KaTeX would refuse or the project's notation forbids."""
    problems = []
    depth = 0
    for ch in re.sub(r"\\[{}]", "", latex):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            problems.append("a '}' closes nothing")
            break
    if depth > 0:
        problems.append("an unclosed '{'")
    delimiters = [re.findall(rf"\\{side}(?![a-zA-Z])", latex) for side in ("left", "right")]
    if len(delimiters[0]) != len(delimiters[1]):
        problems.append(r"\left and \right do not pair")
    if re.search(r"\^T\b|(?<![}])\^\{T\}", latex):  # not a limit: \sum_{t=1}^{T}
        problems.append(r"a transpose written ^T (use ^\top)")
    if re.search(r"\\(begin\{(align|equation|eqnarray)|label|ref|eqref)\b", latex):
        problems.append("a LaTeX environment or command KaTeX does not render inline")
    return problems


@pytest.mark.parametrize("entry", ENTRIES, ids=entry_ids(ENTRIES))
def test_entry_is_well_formed(entry: Equation) -> None:
    assert re.fullmatch(r"[a-z][a-z0-9_]*", entry.id), entry.id
    assert entry.title.strip()
    assert entry.group in GROUPS
    assert entry.latex.strip()
    assert latex_problems(entry.latex) == []
    assert entry.symbols, "no symbols"
    for symbol in entry.symbols:
        assert symbol.name.strip() and symbol.shape.strip() and symbol.meaning.strip()
        assert latex_problems(symbol.name) == []
    assert entry.sources, "no sources"
    for source in entry.sources:
        assert isinstance(source, Source), f"cite with Source(document, where), got {source!r}"
        assert source.document in KNOWN_SOURCES, f"unknown source {source.document!r}"
    assert any(s.where.strip() for s in entry.sources), "no source says where"
    assert "def " in entry.sympy_source
    if entry.tolerance is not None:
        assert entry.tolerance.formula.strip()
        assert latex_problems(entry.tolerance.formula) == []
        assert REDUCTION.fullmatch(entry.tolerance.reduction), entry.tolerance.reduction


@pytest.mark.parametrize("entry", ENTRIES, ids=entry_ids(ENTRIES))
def test_decisions_are_well_formed(entry: Equation) -> None:
    for decision in entry.decisions:
        assert isinstance(decision, Decision)
        assert decision.question.strip() and decision.decision.strip() and decision.why.strip()
        assert decision.readings, f"{decision.question}: no reading"
        for reading in decision.readings:
            assert isinstance(reading.source, Source), \
                f"{decision.question}: cite with Source(document, where), got {reading.source!r}"
            assert reading.source.document in KNOWN_SOURCES
            assert reading.reading.strip()


FORWARD = [e for e in ENTRIES if e.group in FORWARD_GROUPS]


@pytest.mark.parametrize("entry", FORWARD, ids=entry_ids(FORWARD))
def test_forward_entry_has_tolerance_and_inputs_matching_its_functions(entry: Equation) -> None:
    assert entry.tolerance is not None
    assert entry.sympy_inputs
    names = [name for name, _ in entry.sympy_inputs]
    # The sympy form takes exactly the declared inputs, in order (others have defaults).
    form = inspect.signature(entry.sympy).parameters
    assert list(form)[: len(names)] == names
    assert all(p.default is not inspect.Parameter.empty for p in list(form.values())[len(names):])
    # The reference takes the same arguments in the same order (trailing options aside).
    ref = inspect.signature(getattr(reference, entry.reference)).parameters.values()
    required = [p for p in ref if p.default is inspect.Parameter.empty]
    assert len(required) <= len(names) <= len(ref)


def test_every_reference_function_has_an_entry() -> None:
    missing = [name for name in reference.__all__ if name not in REGISTRY]
    assert missing == []


@pytest.mark.parametrize("entry", ENTRIES, ids=entry_ids(ENTRIES))
def test_every_entry_names_an_existing_reference_function(entry: Equation) -> None:
    assert entry.reference == entry.id  # the naming convention of ARCHITECTURE.md
    assert entry.reference in reference.__all__
    assert callable(getattr(reference, entry.reference))


def test_the_forward_entries_are_the_forward_reference() -> None:
    modules = (embedding, attention, block, output)
    assert sorted(e.id for e in FORWARD) == sorted(n for m in modules for n in m.__all__)


def test_the_forward_pass_cites_the_documents() -> None:
    cited = {s.document for e in FORWARD for s in e.sources}
    assert {NOTES, GUIDE, BLUEPRINT} <= cited
    assert set(DOCUMENTS) & cited


# The disagreements between the documents that the specification must settle, each on the
# entry where it arises: (entry, a word that the decision's question or decision contains).
REQUIRED_DECISIONS = [
    ("linear", "row"),
    ("token_embedding_one_hot", "shape"),
    ("attention_scores", "mask"),
    ("causal_mask", "softmax"),
    ("causal_mask", "triangle"),
    ("ffn_guide_product", "elementwise"),
    ("block_pre_ln", "LayerNorm"),
    ("block_post_ln", "LayerNorm"),
    ("block_guide", "LayerNorm"),
    ("unembed_untied", "projection"),
    ("unembed_tied", "tied"),
    ("unembed_untied", "tied"),
    ("sequence_log_probability", "first token"),
    ("layer_norm", "variance"),
    ("gelu_tanh", "tanh"),
    ("qkv_projection", "biases"),
    ("positional_embedding", "positional"),
]


@pytest.mark.parametrize(("entry_id", "word"), REQUIRED_DECISIONS)
def test_required_decision_is_recorded(entry_id: str, word: str) -> None:
    decisions = REGISTRY[entry_id].decisions
    matching = [d for d in decisions
                if word.lower() in (d.question + " " + d.decision).lower()]
    assert matching, f"{entry_id}: no decision about {word!r}"
    for decision in matching:
        assert len({r.source.document for r in decision.readings}) >= 2


def test_latex_check_catches_what_it_claims() -> None:
    assert latex_problems(r"\frac{Q K^T}{\sqrt{d_k}}")
    assert latex_problems(r"H W_e^{T}")
    assert latex_problems(r"\sum_{t=1}^{T} x_t") == []
    assert latex_problems(r"\frac{a}{b")
    assert latex_problems(r"\left( x")
    assert latex_problems(r"g \leftarrow \left( x \right)") == []
    assert latex_problems(r"\frac{Q K^\top}{\sqrt{d_k}}") == []
