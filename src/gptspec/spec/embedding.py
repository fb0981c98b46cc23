"""Spec entries: embedding — from token ids to the first residual stream H⁽⁰⁾.

Row-vector convention (see ARCHITECTURE.md): a sequence of T tokens becomes a (T, d_model)
matrix whose row t is token t's vector. Token ids are a list of integers in [0, V).

``sympy_inputs`` shapes, as the tests read them: ``(a, b)`` a real matrix, ``[k](a, b)``
a list of k real matrices, ``(T,) int < V`` a list of token ids, ``int X`` an integer
size, ``() > 0`` a positive scalar, ``(T, T) mask`` a real matrix that is also tried as
the causal mask, ``config`` / ``params`` / ``block params`` a configuration and
parameters in the canonical schema (``blocks.{l}.`` dropped for one block).
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy as sp

from gptspec.spec.equation import Decision, Reading, Symbol, Tolerance, equation
from gptspec.spec.sources import (
    BLUEPRINT,
    GUIDE,
    NOTES,
    RADFORD_2019,
    VASWANI_2017,
    Source,
)

ROW_VECTORS = Decision(
    question="Are token vectors rows (x ↦ x W) or columns (x ↦ W x)?",
    readings=(
        Reading(Source(NOTES, "sec. 1.2; Foundational Learning, dimension check"),
                r"column vectors: the embedding is $W_E \in \mathbb{R}^{d \times "
                r"n_{\mathrm{vocab}}}$"
                r" applied to a one-hot column, $e = W_E\,x$"),
        Reading(Source(GUIDE, "sec. 4, sec. 6"), r"column vectors: $W_1 x + b_1$, $O = W H + b$"),
        Reading(Source(BLUEPRINT, "eqs 2, 6, 9"),
                r"row vectors: $Q = H W_Q$, $x W_1 + b_1$, $H W_e^\top$"),
        Reading(Source(RADFORD_2019, "sec. 2.3 (and its released code)"),
                "row vectors: activations (T, d), weights stored (in, out)"),
    ),
    decision=r"Row vectors everywhere: a sequence is a (T, d) matrix, a linear map is "
             r"$x W + b$ with $W$ of shape (in, out). The Notes' $W_E$ ($d \times "
             r"n_{\mathrm{vocab}}$) "
             r"is our $W_E$ ($V \times d$) transposed; the Guide's $W x + b$ is our $x W^\top "
             r"+ b$.",
    why="The Blueprint, GPT-2's checkpoints and every array library store a batch of "
        "tokens as rows; with rows a batch is one matrix product and the parameter layout "
        "matches GPT-2's files without transposes.",
)


@equation(
    id="one_hot",
    title="One-hot encoding",
    group="embedding",
    latex=r"X_{t v} = [x_t = v], \qquad X \in \{0, 1\}^{T \times V}",
    symbols=(
        Symbol("x", "(T,)", "token ids, each in [0, V)"),
        Symbol("X", "(T, V)", "one-hot rows: row t is the unit vector of token x_t"),
    ),
    sources=(Source(NOTES, "sec. 1.2 (one-hot encoding)"),),
    reference="one_hot",
    tolerance=Tolerance("0", reduction="1", note="exact: every entry is 0 or 1"),
    decisions=(ROW_VECTORS,),
    sympy_inputs=(("x", "(T,) int < V"), ("vocab_size", "int V")),
)
def one_hot(x: Sequence[int], vocab_size: int) -> sp.Matrix:
    return sp.Matrix(len(x), vocab_size, lambda t, v: sp.KroneckerDelta(x[t], v))


EMBEDDING_DIMENSIONS = Decision(
    question="What shape is the token embedding matrix?",
    readings=(
        Reading(Source(NOTES, "Foundational Learning, dimension check"),
                r"$W_E$ is $d \times n_{\mathrm{vocab}}$ and a one-hot column "
                r"$n_{\mathrm{vocab}} \times 1$"
                r" embeds to $d \times 1$"),
        Reading(Source(BLUEPRINT, "sec. 2.1, eq 9"),
                r"$W_e$ maps $x_i$ to $e_{x_i} \in \mathbb{R}^{d_{\mathrm{model}}}$; eq 9 uses"
                r" $H W_e^\top$, so $W_e$ is $V \times d_{\mathrm{model}}$"),
        Reading(Source(GUIDE, "sec. 2"), r"$z_i = E(x_i)$ with $E$ 'the embedding matrix'"),
    ),
    decision=r"$W_E \in \mathbb{R}^{V \times d_{\mathrm{model}}}$ (schema name ``wte``), one "
             r"row per "
             r"token: the Notes' matrix transposed. The dimension check holds in our "
             r"convention as $(1 \times V)(V \times d) = 1 \times d$.",
    why="Rows for tokens (the row-vector decision) and GPT-2's stored layout.",
)


@equation(
    id="token_embedding_one_hot",
    title="Token embedding as a one-hot product",
    group="embedding",
    latex=r"E = X\,W_E, \qquad e_t = \sum_{v=0}^{V-1} X_{t v}\,(W_E)_{v,:}",
    symbols=(
        Symbol("X", "(T, V)", "one-hot rows of the tokens"),
        Symbol("W_E", "(V, d_model)", "token embedding matrix (wte)"),
        Symbol("E", "(T, d_model)", "token embeddings, one row per position"),
        Symbol("e_t", "(d_model,)", "row t of E: the embedding of the token at position t"),
    ),
    sources=(
        Source(NOTES, "sec. 1.2 (embedding of one-hot vectors)"),
        Source(BLUEPRINT, "sec. 2.1, item 1"),
    ),
    reference="token_embedding_one_hot",
    tolerance=Tolerance(r"0",
                        reduction="1",
                        note="one non-zero summand per output, every other product an exact zero: the "
                             "result is a copy of a row of W_E, exact"),
    decisions=(ROW_VECTORS, EMBEDDING_DIMENSIONS),
    sympy_inputs=(("X", "(T, V)"), ("W_E", "(V, d_model)")),
)
def token_embedding_one_hot(X: sp.Matrix, W_E: sp.Matrix) -> sp.Matrix:
    return X * W_E


@equation(
    id="token_embedding",
    title="Token embedding as row selection",
    group="embedding",
    latex=r"e_t = (W_E)_{x_t,:}, \qquad E = \begin{pmatrix} (W_E)_{x_1,:} \\ \vdots \\ "
          r"(W_E)_{x_T,:}"
          r"\end{pmatrix}",
    symbols=(
        Symbol("x", "(T,)", "token ids"),
        Symbol("W_E", "(V, d_model)", "token embedding matrix (wte)"),
        Symbol("E", "(T, d_model)", "token embeddings"),
        Symbol("e_t", "(d_model,)", "row t of E: row x_t of W_E"),
    ),
    sources=(
        Source(BLUEPRINT, "sec. 2.1, item 1"),
        Source(GUIDE, "sec. 2: z_i = E(x_i)"),
        Source(NOTES, "sec. 1.2"),
        Source(RADFORD_2019, "sec. 2.3"),
    ),
    reference="token_embedding",
    tolerance=Tolerance(r"0",
                        reduction="1",
                        note="a copy of a row of W_E: no arithmetic, so exact"),
    decisions=(
        EMBEDDING_DIMENSIONS,
        Decision(
            question=r"Is the embedding scaled by $\sqrt{d_{\mathrm{model}}}$?",
            readings=(
                Reading(Source(VASWANI_2017, "sec. 3.4"),
                        r"embeddings are multiplied by $\sqrt{d_{\mathrm{model}}}$"),
                Reading(Source(BLUEPRINT, "sec. 2.1"), r"$h_i^{(0)} = e_{x_i} + p_i$, no scale"),
                Reading(Source(RADFORD_2019, "sec. 2.3 (released code)"), "no scale"),
            ),
            decision="No scale: e_t is the row of W_E as stored.",
            why="The Blueprint and GPT-2 agree, and GPT-2's checkpoints assume no scale.",
        ),
    ),
    notes="The same map as token_embedding_one_hot: selecting row x_t equals multiplying by the "
          "one-hot row of x_t (the embedding round trip the Notes' checks ask for).",
    sympy_inputs=(("x", "(T,) int < V"), ("W_E", "(V, d_model)")),
)
def token_embedding(x: Sequence[int], W_E: sp.Matrix) -> sp.Matrix:
    return sp.Matrix.vstack(*[W_E.row(x_t) for x_t in x])


@equation(
    id="positional_embedding",
    title="Learned positional embedding",
    group="embedding",
    latex=r"P = \begin{pmatrix} (W_P)_{1,:} \\ \vdots \\ (W_P)_{T,:} \end{pmatrix}"
          r"\in \mathbb{R}^{T \times d_{\mathrm{model}}}, \qquad T \le n_{\mathrm{ctx}}",
    symbols=(
        Symbol("T", "()", "sequence length, at most n_ctx"),
        Symbol("W_P", "(n_ctx, d_model)", "positional embedding matrix (wpe), one row per "
               "position"),
        Symbol("P", "(T, d_model)", "the first T rows of W_P"),
    ),
    sources=(
        Source(BLUEPRINT, "sec. 2.1, item 2"),
        Source(RADFORD_2019, "sec. 2.3"),
        Source(VASWANI_2017, "sec. 3.5"),
    ),
    reference="positional_embedding",
    tolerance=Tolerance(r"0",
                        reduction="1",
                        note="a copy of the first T rows of W_P: no arithmetic, so exact"),
    decisions=(
        Decision(
            question="Learned or fixed positional encodings, and does every document have them?",
            readings=(
                Reading(Source(VASWANI_2017, "sec. 3.5"),
                        "fixed sinusoids (learned ones reported as nearly equivalent)"),
                Reading(Source(BLUEPRINT, "sec. 2.1, item 2"), "learned p_i, added to e_{x_i}"),
                Reading(Source(GUIDE, "sec. 2"),
                        "no positional information at all: z_i = E(x_i) feeds the first layer"),
                Reading(Source(RADFORD_2019, "sec. 2.3"), "learned (wpe), n_ctx = 1024 rows"),
            ),
            decision="Learned positional embeddings W_P of shape (n_ctx, d_model), rows 1..T "
                     "added to the token embeddings, where the configuration has them "
                     "(positional_embedding = true: GPT-2, GPT-3, the Blueprint). The `guide` "
                     "preset is the Guide as written: no W_P, H⁽⁰⁾ = E; `guide-positional` "
                     "adds W_P to the Guide's model.",
            why="Each document's model is reproduced as written. Without positions a causal "
                "transformer sees order only through the mask; the Blueprint and GPT-2 add "
                "learned positions, and GPT-2's checkpoints contain them.",
        ),
    ),
    sympy_inputs=(("T", "int T"), ("W_P", "(n_ctx, d_model)")),
)
def positional_embedding(T: int, W_P: sp.Matrix) -> sp.Matrix:
    return W_P[:T, :]


@equation(
    id="input_representation",
    title="Input representation",
    group="embedding",
    latex=r"h_t^{(0)} = e_t + p_t, \qquad H^{(0)} = E + P",
    symbols=(
        Symbol("E", "(T, d_model)", "token embeddings"),
        Symbol("P", "(T, d_model)", "positional embeddings"),
        Symbol("H^{(0)}", "(T, d_model)", "the residual stream entering the first block"),
        Symbol("e_t, p_t, h_t^{(0)}", "(d_model,)", "row t of E, P and H^{(0)}"),
    ),
    sources=(Source(BLUEPRINT, "sec. 2.1"), Source(RADFORD_2019, "sec. 2.3"),
             Source(VASWANI_2017, "sec. 3.5")),
    reference="input_representation",
    tolerance=Tolerance(r"\lambda\,u\,|E + P|",
                        reduction="1",
                        note="one addition per entry; its check: λ·u|e + p| (one rounding)"),
    sympy_inputs=(("E", "(T, d_model)"), ("P", "(T, d_model)")),
)
def input_representation(E: sp.Matrix, P: sp.Matrix) -> sp.Matrix:
    return E + P
