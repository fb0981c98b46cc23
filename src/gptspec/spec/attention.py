"""Spec entries: attention — linear maps, heads, the causal mask, softmax and attention.

Row vectors: H is (T, d_model); Q, K, V are (T, d_model) for all heads together and
(T, d_k) for one head, d_k = d_model / h. A bias is a (1, n) row added to every row.
"""

from __future__ import annotations

import sympy as sp

from gptspec.spec.embedding import ROW_VECTORS
from gptspec.spec.equation import Decision, Reading, Symbol, Tolerance, equation
from gptspec.spec.sources import (
    BLUEPRINT,
    BROWN_2020,
    GUIDE,
    HIGHAM_MARY_2019,
    MICIKEVICIUS_2018,
    NOTES,
    RADFORD_2019,
    VASWANI_2017,
    Source,
)


def _each_row(b: sp.Matrix, rows: int) -> sp.Matrix:
    """The row vector b repeated on ``rows`` rows (the broadcast of x W + b)."""
    return sp.ones(rows, 1) * b


@equation(
    id="linear",
    title="Affine map (row vectors)",
    group="attention",
    latex=r"y = x\,W + b, \qquad y_j = \sum_{i=1}^{n} x_i W_{i j} + b_j",
    symbols=(
        Symbol("x", "(T, n)", "input rows"),
        Symbol("W", "(n, m)", "weight, stored (in, out)"),
        Symbol("b", "(m,)", "bias (optional), added to every row"),
        Symbol("y", "(T, m)", "output rows"),
    ),
    sources=(Source(BLUEPRINT, "eqs 2, 6"), Source(VASWANI_2017, "sec. 3.3, eq 2"),
             Source(RADFORD_2019, "sec. 2.3")),
    reference="linear",
    tolerance=Tolerance(r"\lambda\left(\sqrt{n}\,u\,(|x|\,|W| + |b|) \oplus u\,|y|\right)",
                        reduction="n",
                        note="Higham & Mary 2019: each inner product of length n (+1 for the bias) "
                             "carries a probabilistic error of λ√n u times the sum of |x_i W_ij|; "
                             "storing y rounds it once more (u|y|); its check: λ·(√n·u·(|x||W| + |b|) ⊕ "
                             "u|y|), n = d_in (+1 for the bias)"),
    decisions=(ROW_VECTORS,),
    sympy_inputs=(("x", "(T, n)"), ("W", "(n, m)"), ("b", "(1, m)")),
)
def linear(x: sp.Matrix, W: sp.Matrix, b: sp.Matrix | None = None) -> sp.Matrix:
    y = x * W
    return y if b is None else y + _each_row(b, x.rows)


QKV_BIASES = Decision(
    question="Do the query, key and value maps have biases?",
    readings=(
        Reading(Source(BLUEPRINT, "eq 2"), r"$Q = H W_Q$, $K = H W_K$, $V = H W_V$: no biases"),
        Reading(Source(VASWANI_2017, "sec. 3.2.2"), "projections written without biases"),
        Reading(Source(RADFORD_2019, "sec. 2.3 (released code)"),
                "one fused map with a bias, c_attn: x W + b with W of shape (d, 3d)"),
    ),
    decision=r"One fused map $[Q\,|\,K\,|\,V] = H\,[W_Q\,|\,W_K\,|\,W_V] + [b_Q\,|\,b_K\,|\,b_V]$; "
             "the biases exist when config.attn_bias is true (GPT-2) and are absent otherwise "
             "(the Blueprint's eq 2 is config.attn_bias = false, its preset's setting).",
    why="Both readings are kept as one switch, separate from the FFN's biases (the "
        "Blueprint's eq 6 has b_1 and b_2); the fused layout is GPT-2's and is the "
        "canonical parameter schema (attn.w_qkv, attn.b_qkv).",
)


HEAD_WIDTH = Decision(
    question="Is the head width d_k (the Notes' d_H) tied to d_model / h?",
    readings=(
        Reading(Source(NOTES, "sec. 3.1"), "the head dimension d_H is a parameter of its own; "
                "W_O maps the h concatenated heads (h·d_H) back to d_model"),
        Reading(Source(BLUEPRINT, "eq 2"), r"$W_Q \in \mathbb{R}^{d_{\mathrm{model}} \times d_k}$, d_k "
                "not tied to d_model"),
        Reading(Source(VASWANI_2017, "sec. 3.2.2"), "d_k = d_v = d_model / h"),
        Reading(Source(BROWN_2020, "Table 2.1"), "d_head listed per model; in two rows "
                "n_heads × d_head ≠ d_model"),
    ),
    decision="d_k = d_H is free (config.d_head, default d_model / h): W_QKV is "
             "(d_model, 3 h d_k), the heads' concatenation is h·d_k wide and W_O is "
             "(h d_k, d_model). Every backend must accept h·d_k ≠ d_model.",
    why="The Notes treat d_H as free and GPT-3's table needs it; with d_k = d_model / h "
        "(GPT-2, the default) nothing changes.",
)


@equation(
    id="qkv_projection",
    title="Query, key and value projections",
    group="attention",
    latex=r"Q = H W_Q + b_Q, \quad K = H W_K + b_K, \quad V = H W_V + b_V, \qquad"
          r"[\,Q \mid K \mid V\,] = H\,[\,W_Q \mid W_K \mid W_V\,] + [\,b_Q \mid b_K \mid b_V\,]",
    symbols=(
        Symbol("H", "(T, d_model)", "the (normalised) residual stream"),
        Symbol(r"[W_Q \mid W_K \mid W_V]", "(d_model, 3 h d_k)",
               "the query, key and value maps of all heads side by side (attn.w_qkv)"),
        Symbol(r"[b_Q \mid b_K \mid b_V]", "(3 h d_k,)",
               "their biases (attn.b_qkv; zero when config.attn_bias is false)"),
        Symbol("Q, K, V", "(T, h d_k)", "queries, keys, values of all heads side by side"),
    ),
    sources=(Source(BLUEPRINT, "eq 2"), Source(VASWANI_2017, "sec. 3.2.2"),
             Source(NOTES, "sec. 3.1"), Source(RADFORD_2019, "sec. 2.3")),
    reference="qkv_projection",
    tolerance=Tolerance(r"\lambda\left(\sqrt{d_{\mathrm{model}}}\,u\,(|H|\,|W_{QKV}| + "
                        r"|b_{QKV}|) \oplus u\,|[\,Q \mid K \mid V\,]|\right)",
                        reduction="d_model",
                        note="linear's budget with x = H, W = W_QKV, b = b_QKV and y = [Q | K | V], n = "
                             "d_model; its check: λ·(√n·u·(|x||W| + |b|) ⊕ u|y|), n = d_in (+1 for the "
                             "bias)"),
    decisions=(QKV_BIASES, ROW_VECTORS, HEAD_WIDTH),
    sympy_inputs=(("H", "(T, d_model)"), ("W_qkv", "(d_model, 3*h*d_k)"),
                  ("b_qkv", "(1, 3*h*d_k)")),
)
def qkv_projection(H: sp.Matrix, W_qkv: sp.Matrix, b_qkv: sp.Matrix | None = None
                   ) -> tuple[sp.Matrix, sp.Matrix, sp.Matrix]:
    QKV = linear.sympy(H, W_qkv, b_qkv)
    d = QKV.cols // 3
    return QKV[:, :d], QKV[:, d:2 * d], QKV[:, 2 * d:]


@equation(
    id="split_heads",
    title="Splitting into heads",
    group="attention",
    latex=r"X^{(i)} = X_{:,\;(i-1) d_k + 1 \,\ldots\, i\, d_k}, \qquad i = 1, \ldots, h,"
          r"\quad d_k = d_{\mathrm{model}} / h \text{ unless the head width is free}",
    symbols=(
        Symbol("X", "(T, h d_k)", "queries, keys or values of all heads"),
        Symbol("X^{(i)}", "(T, d_k)", "head i's columns, for each of the h heads"),
    ),
    sources=(Source(BLUEPRINT, "eq 5"), Source(VASWANI_2017, "sec. 3.2.2")),
    reference="split_heads",
    tolerance=Tolerance("0", reduction="1", note="data movement: exact"),
    notes="Head i's projection W_Q^{(i)} of the Blueprint's eq 5 is columns (i−1)d_k+1 … i d_k "
          "of W_Q, so splitting H W_Q by columns equals H W_Q^{(i)} for each head.",
    decisions=(HEAD_WIDTH,),
    sympy_inputs=(("X", "(T, h*d_k)"), ("n_heads", "int h")),
)
def split_heads(X: sp.Matrix, n_heads: int) -> list[sp.Matrix]:
    d_k = X.cols // n_heads
    return [X[:, i * d_k:(i + 1) * d_k] for i in range(n_heads)]


@equation(
    id="merge_heads",
    title="Concatenating heads",
    group="attention",
    latex=r"\operatorname{Concat}(\mathrm{head}_1, \ldots, \mathrm{head}_h) = "
          r"[\,\mathrm{head}_1 \mid \cdots \mid \mathrm{head}_h\,]",
    symbols=(
        Symbol(r"\mathrm{head}_i", "(T, d_k)", "head i's output, i = 1, …, h"),
        Symbol(r"\operatorname{Concat}", "(T, h d_k)", "the heads side by side"),
    ),
    sources=(Source(BLUEPRINT, "eq 4"), Source(VASWANI_2017, "sec. 3.2.2")),
    reference="merge_heads",
    tolerance=Tolerance("0", reduction="1", note="data movement: exact"),
    sympy_inputs=(("heads", "[h](T, d_k)"),),
)
def merge_heads(heads: list[sp.Matrix]) -> sp.Matrix:
    return sp.Matrix.hstack(*heads)


MODIFIED_SOFTMAX = Decision(
    question="How is attention to later positions prevented?",
    readings=(
        Reading(Source(NOTES, "sec. 3.1"),
                "a 'modified softmax' that normalises only over the positions j ≤ i"),
        Reading(Source(BLUEPRINT, "eq 3"), r"an additive mask $M$ of zeros and $-\infty$"),
        Reading(Source(VASWANI_2017, "sec. 3.2.3"),
                r"illegal connections set to $-\infty$ before the softmax"),
        Reading(Source(GUIDE, "sec. 3, sec. 6"),
                "no mask in its attention formula, though generation is autoregressive"),
    ),
    decision=r"An additive mask $M_{ij} = 0$ for $j \le i$ and $-\infty$ for $j > i$, then the "
             r"ordinary softmax. With $e^{-\infty} = 0$ this is exactly the Notes' modified "
             r"softmax; the Guide's attention is read as causal.",
    why="One softmax for every use; the two formulations give identical weights because "
        "masked terms contribute exactly zero to numerator and denominator. The Guide's "
        "model is trained with a causal-LM loss (its sec. 7), which needs causal attention.",
)


@equation(
    id="causal_mask",
    title="Causal mask",
    group="attention",
    latex=r"M_{ij} = \begin{cases} 0 & j \le i \\ -\infty & j > i \end{cases}, \qquad "
          r"M \in \{0, -\infty\}^{T \times T}",
    symbols=(
        Symbol("T", "()", "sequence length"),
        Symbol("M", "(T, T)", "zero on and below the diagonal, −∞ strictly above"),
    ),
    sources=(Source(BLUEPRINT, "eq 3"), Source(VASWANI_2017, "sec. 3.2.3"),
             Source(NOTES, "sec. 3.1")),
    reference="causal_mask",
    tolerance=Tolerance("0", reduction="1", note="exact: every entry is 0 or −∞"),
    decisions=(
        MODIFIED_SOFTMAX,
        Decision(
            question="Which triangle holds the −∞?",
            readings=(
                Reading(Source(BLUEPRINT, "eq 3"),
                        r"'a lower-triangular matrix of zeros and $-\infty$'"),
                Reading(Source(VASWANI_2017, "sec. 3.2.3"),
                        "prevent leftward flow: position i may not attend to j > i"),
            ),
            decision=r"$-\infty$ strictly above the diagonal ($j > i$), zeros on and below it.",
            why="Read literally, a lower-triangular −∞ would hide the past and show the future; "
                "the Blueprint's own words ('prevents positions from attending to subsequent "
                "positions') fix the intent: the zeros form the lower triangle.",
        ),
    ),
    sympy_inputs=(("T", "int T"),),
)
def causal_mask(T: int) -> sp.Matrix:
    return sp.Matrix(T, T, lambda i, j: 0 if j <= i else -sp.oo)


SOFTMAX_RANGE = Decision(
    question="What must softmax do at the edges of a floating-point format's range?",
    readings=(
        Reading(Source(BLUEPRINT, "eqs 3, 9"),
                "exact arithmetic: exponentials of every score, normalised; nothing about "
                "range"),
        Reading(Source(VASWANI_2017, "sec. 3.2.1"),
                r"scores are scaled by $1/\sqrt{d_k}$ because large dot products push "
                "softmax into regions of tiny gradients: large scores are expected"),
        Reading(Source(HIGHAM_MARY_2019, "sec. 1"),
                "floating-point results are the exact ones rounded, with a unit roundoff "
                "and a finite range"),
    ),
    decision="Inputs are finite values of the backend's dtype, up to its largest "
             "(float16: 65504), down to its subnormals. For every such row, every output "
             "is finite, in [0, 1], and within the budget of the exact softmax of the "
             "rounded inputs: a conforming backend computes exp(z − max z), or the "
             "equivalent online form over blocks, never exp(z) alone; a 16-bit backend "
             "computes it in float32 and rounds once. Only a result whose exact value "
             "exceeds the dtype's largest value may be ±∞, and a softmax has none.",
    why="The mathematics is defined for every real row and its values lie in [0, 1], so "
        "an overflow inside the computation is the implementation's, not the model's. "
        "16-bit exp overflows at 11.1 (float16), and exp(z) alone at 88.7 in float32; "
        "attention scores and logits pass both in real models.",
)


@equation(
    id="softmax",
    title="Softmax",
    group="attention",
    latex=r"\operatorname{softmax}(z)_i = \frac{e^{z_i}}{\sum_{j=1}^{n} e^{z_j}}",
    symbols=(Symbol("z", "(m, n)", "rows of scores or logits; softmax acts on each row"),),
    sources=(Source(BLUEPRINT, "eqs 3, 9"), Source(GUIDE, "sec. 3, sec. 6"),
             Source(NOTES, "sec. 3.1"), Source(VASWANI_2017, "sec. 3.2.1")),
    reference="softmax",
    tolerance=Tolerance(r"\lambda\,\operatorname{softmax}(z)_i\left((4 + s_n)\,u \oplus u\,|z_i "
                        r"- \max_j z_j|\right)",
                        reduction="n",
                        note="relative per entry: the sum of n exponentials (s_n·u), the exponential, "
                             "the subtraction and the division (4u), and the rounding of the argument "
                             "z_i − max z, which exp turns into a relative error u|z_i − max z|; "
                             "independent errors add in quadrature (⊕); s_n = max(√n, (n − 1)/λ) is the "
                             "error scale of a sum of n terms of one sign (a sequential sum of nearly "
                             "equal terms rounds the same way at every step); its check: λ·y·((4 + "
                             "s(n))·u ⊕ u|z − max z|), n = row length, s(n) = max(√n, (n − 1)/λ) (a sum "
                             "of n terms of one sign)"),
    notes=r"Entries equal to $-\infty$ contribute $e^{-\infty} = 0$; a row needs one finite entry.",
    decisions=(SOFTMAX_RANGE,),
    sympy_inputs=(("z", "(m, n)"),),
)
def softmax(z: sp.Matrix) -> sp.Matrix:
    e = z.applyfunc(sp.exp)
    return sp.Matrix(z.rows, z.cols, lambda i, j: e[i, j] / sum(e.row(i)))


@equation(
    id="softmax_shifted",
    title="Softmax shift identity",
    group="attention",
    latex=r"\frac{e^{z_i - c}}{\sum_{j=1}^{n} e^{z_j - c}} = \operatorname{softmax}(z)_i"
          r"\quad \text{for every finite } c",
    symbols=(
        Symbol("z", "(m, n)", "rows of scores"),
        Symbol("c", "(m, 1)", "a shift per row (the reference's softmax uses c = max_j z_j)"),
    ),
    sources=(Source(BLUEPRINT, "eq 3"), Source(VASWANI_2017, "sec. 3.2.1")),
    reference="softmax_shifted",
    tolerance=Tolerance(r"\lambda\,\operatorname{softmax}(z)_i\left((4 + s_n)\,u \oplus u\,|z_i "
                        r"- c|\right)",
                        reduction="n",
                        note="softmax's budget with z − c in place of z − max z; its check: λ·y·((4 + "
                             "s(n))·u ⊕ u|z − max z|), n = row length, s(n) = max(√n, (n − 1)/λ) (a sum "
                             "of n terms of one sign), with z − c in place of z − max z"),
    notes="The identity holds because e^{−c} cancels between numerator and denominator; with "
          "c = max z every exponent is ≤ 0 and nothing overflows. The sympy form is the left "
          "side; the tests compare it with softmax symbolically too.",
    sympy_inputs=(("z", "(m, n)"), ("c", "(m, 1)")),
)
def softmax_shifted(z: sp.Matrix, c: sp.Matrix) -> sp.Matrix:
    e = sp.Matrix(z.rows, z.cols, lambda i, j: sp.exp(z[i, j] - c[i, 0]))
    return sp.Matrix(z.rows, z.cols, lambda i, j: e[i, j] / sum(e.row(i)))


MASK_PLACEMENT = Decision(
    question=r"Is the mask added before or after dividing by $\sqrt{d_k}$?",
    readings=(
        Reading(Source(BLUEPRINT, "eq 3"),
                r"$\operatorname{softmax}\!\left(\frac{Q K^\top + M}{\sqrt{d_k}}\right) V$"),
        Reading(Source(VASWANI_2017, "sec. 3.2.1, 3.2.3"),
                r"scale $Q K^\top / \sqrt{d_k}$, then set masked entries to $-\infty$"),
        Reading(Source(RADFORD_2019, "sec. 2.3 (released code)"),
                "scale, then mask (masked entries replaced by a very negative number)"),
        Reading(Source(GUIDE, "sec. 3"),
                r"$\operatorname{softmax}(Q K^\top / \sqrt{d_k}) V$, no mask"),
    ),
    decision=r"$S = Q K^\top / \sqrt{d_k} + M$: scale, then add the mask.",
    why=r"For $M \in \{0, -\infty\}$ both readings give the same $S$, since "
        r"$-\infty / \sqrt{d_k} = -\infty$ and $0 / \sqrt{d_k} = 0$. They differ only for a "
        r"finite non-zero M (e.g. an additive bias), where adding after the scale keeps M "
        r"in the units of the scores, as in Vaswani et al. and GPT-2.",
)


SCORES_RANGE = Decision(
    question=r"In a 16-bit format, must $S$ be right where $Q K^\top$ lies past the format's "
             r"largest value but $S = Q K^\top / \sqrt{d_k}$ does not?",
    readings=(
        Reading(Source(BLUEPRINT, "eq 3"),
                r"$S$ is defined exactly; the documents say nothing of number formats"),
        Reading(Source(MICIKEVICIUS_2018, "sec. 3.3"),
                "16-bit products are accumulated in float32 and rounded to 16 bits when "
                "stored"),
    ),
    decision=r"Yes where $Q K^\top$ fits the accumulation format: a 16-bit backend forms "
             r"$Q K^\top / \sqrt{d_k}$ in float32 and rounds $S$ once, so in float16 "
             r"(largest 65504) a score is right whenever it is representable. Where "
             r"$Q K^\top$ exceeds the accumulation format itself (float32 and bfloat16, "
             r"whose ranges are float32's) the spec asks nothing, and the suite draws no "
             r"such input; nor where $S$ itself lies past the format's largest value, of "
             r"$S$ or of what is computed from it (an engine that stores $S$ in float16 "
             r"gets $\infty$ there, and NaN from the softmax).",
    why=r"Rounding $Q K^\top$ to float16 before scaling turns a score of $1.3 \cdot 10^4$ "
        r"with $d_k = 64$ into $\infty$, and under the mask into $\infty - \infty = "
        r"\mathrm{NaN}$: a real failure of 16-bit attention, which fused kernels avoid by "
        r"scaling inside the product. At float32's range no engine checked (XLA, ONNX "
        r"Runtime, PyTorch's own) avoids it, and no model's scores come near it.",
)


@equation(
    id="attention_scores",
    title="Attention scores",
    group="attention",
    latex=r"S = \frac{Q K^\top}{\sqrt{d_k}} + M",
    symbols=(
        Symbol("Q", "(T, d_k)", "one head's queries"),
        Symbol("K", "(T, d_k)", "one head's keys"),
        Symbol("M", "(T, T)", "additive mask (the causal mask in the model)"),
        Symbol("S", "(T, T)", "scores: row i scores query i against every key"),
    ),
    sources=(Source(BLUEPRINT, "eq 3"), Source(VASWANI_2017, "sec. 3.2.1, eq 1"),
             Source(GUIDE, "sec. 3")),
    reference="attention_scores",
    tolerance=Tolerance(r"\lambda\left(\sqrt{d_k}\,u\,\frac{|Q|\,|K|^\top}{\sqrt{d_k}} \oplus "
                        r"u\,|S|\right)",
                        reduction="d_k",
                        note="Q Kᵀ sums d_k products; storing S rounds it once; masked entries are "
                             "exactly −∞; for a backend that scales Q and K by d_k^(−1/4) before the "
                             "product (as fused kernels do) two more roundings, 2u|Q||K|ᵀ/√d_k, are "
                             "allowed in quadrature; its check: λ·(√d_k·u·|Q||K|ᵀ/√d_k ⊕ u|S|); masked "
                             "entries exactly −∞"),
    decisions=(MASK_PLACEMENT, SCORES_RANGE),
    sympy_inputs=(("Q", "(T, d_k)"), ("K", "(T, d_k)"), ("M", "(T, T) mask")),
)
def attention_scores(Q: sp.Matrix, K: sp.Matrix, M: sp.Matrix) -> sp.Matrix:
    return Q * K.T / sp.sqrt(Q.cols) + M


@equation(
    id="attention_weights",
    title="Attention weights",
    group="attention",
    latex=r"A = \operatorname{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}} + M\right)"
          r"\quad \text{(row by row)}",
    symbols=(
        Symbol("Q", "(T, d_k)", "one head's queries"),
        Symbol("K", "(T, d_k)", "one head's keys"),
        Symbol("M", "(T, T)", "additive mask"),
        Symbol("A", "(T, T)", "weights: each row sums to one; zero above the diagonal when M "
                              "is causal"),
    ),
    sources=(Source(BLUEPRINT, "eq 3"), Source(VASWANI_2017, "sec. 3.2.1"),
             Source(NOTES, "sec. 3.1")),
    reference="attention_weights",
    tolerance=Tolerance(r"\lambda\left(A_{ij}\sqrt{\delta_{ij}^2 + \textstyle\sum_k "
                        r"A_{ik}^2\,\delta_{ik}^2} \oplus (4 + s_T)\,u\,A_{ij} \oplus "
                        r"u\,|A_{ij}|\right),\quad \delta_{ij} = \varepsilon_{S,ij} \oplus "
                        r"u\,|S_{ij} - \max_k S_{ik}|",
                        reduction="T",
                        note="to first order, a score error δ_ij moves exp(S_ij) by the relative error "
                             "δ_ij and the normaliser by √(Σ_k (A_ik δ_ik)²), adding in quadrature; ε_S "
                             "is the scores' error scale (attention_scores' budget without λ) and the "
                             "shift S − max S rounds once more; the exponentials, their sum and the "
                             "division add softmax's (4 + s_T)u (s_n as in softmax's budget), and "
                             "storing A rounds once. budgets.softmax_bound carries δ through exp exactly "
                             "((e^{λδ} − 1)/λ in place of δ) and caps a weight whose row is only known "
                             "to lie in [0, 1] at max(A_ij, 1 − A_ij)/λ; masked weights are exactly 0; "
                             "its check: the scores' error propagated through softmax "
                             "(budgets.attention_bound)"),
    decisions=(MODIFIED_SOFTMAX, MASK_PLACEMENT),
    sympy_inputs=(("Q", "(T, d_k)"), ("K", "(T, d_k)"), ("M", "(T, T) mask")),
)
def attention_weights(Q: sp.Matrix, K: sp.Matrix, M: sp.Matrix) -> sp.Matrix:
    return softmax.sympy(attention_scores.sympy(Q, K, M))


@equation(
    id="scaled_dot_product_attention",
    title="Scaled dot-product attention",
    group="attention",
    latex=r"\operatorname{Attention}(Q, K, V) = "
          r"\operatorname{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}} + M\right) V",
    symbols=(
        Symbol("Q", "(T, d_k)", "one head's queries"),
        Symbol("K", "(T, d_k)", "one head's keys"),
        Symbol("V", "(T, d_k)", "one head's values"),
        Symbol("M", "(T, T)", "additive mask"),
        Symbol(r"\operatorname{Attention}", "(T, d_k)", "row i mixes the value rows by A_i"),
    ),
    sources=(Source(BLUEPRINT, "eq 3"), Source(GUIDE, "sec. 3"),
             Source(VASWANI_2017, "sec. 3.2.1, eq 1"), Source(NOTES, "sec. 3.1")),
    reference="scaled_dot_product_attention",
    tolerance=Tolerance(r"\lambda\left(\sqrt{T}\,u\,A\,|V| \oplus \sqrt{\varepsilon_A^2\,V^2} "
                        r"\oplus u\,|O|\right)",
                        reduction="T",
                        note="ε_A is attention_weights' error scale (its budget without λ), carried "
                             "through the product A V with squares taken entry by entry; the product "
                             "sums T terms (√T·u) and storing O rounds once; where a row's weights are "
                             "only known to lie in [0, 1], the range of V over the visible keys bounds "
                             "that row's output instead; where a row's weights all lie within a factor "
                             "1 + 2u of each other, storing them rounds them alike, and u·Σ_j A_ij|V_j| "
                             "(their worst case) bounds that row; its check: scores → softmax → A V, "
                             "propagated (budgets.attention_bound)"),
    decisions=(MASK_PLACEMENT, MODIFIED_SOFTMAX),
    sympy_inputs=(("Q", "(T, d_k)"), ("K", "(T, d_k)"), ("V", "(T, d_k)"),
                  ("M", "(T, T) mask")),
)
def scaled_dot_product_attention(Q: sp.Matrix, K: sp.Matrix, V: sp.Matrix, M: sp.Matrix
                                 ) -> sp.Matrix:
    return attention_weights.sympy(Q, K, M) * V


MULTI_HEAD = Decision(
    question="Which attention pattern, and is there an output bias?",
    readings=(
        Reading(Source(BLUEPRINT, "eqs 4–5"),
                r"$\operatorname{Concat}(\mathrm{head}_1, \ldots, \mathrm{head}_h) W_O$, no bias"),
        Reading(Source(RADFORD_2019, "sec. 2.3 (released code)"),
                "dense causal attention; the output map c_proj has a bias"),
        Reading(Source(BROWN_2020, "sec. 2.1"),
                "as GPT-2, but alternating dense and locally banded sparse attention layers"),
    ),
    decision=r"Dense causal attention in every layer; $+\,b_O$ when config.attn_bias is true "
             "(GPT-2), none otherwise (the Blueprint).",
    why="Dense attention is what the Blueprint, the Notes and GPT-2 describe and what GPT-2's "
        "checkpoints compute; GPT-3's sparse pattern is an efficiency measure outside the "
        "documents' model.",
)


@equation(
    id="multi_head_attention",
    title="Masked multi-head self-attention",
    group="attention",
    latex=r"\operatorname{MultiHead}(H) = \operatorname{Concat}(\mathrm{head}_1, \ldots, "
          r"\mathrm{head}_h)\,W_O + b_O, \quad \mathrm{head}_i = \operatorname{Attention}"
          r"(H W_Q^{(i)} + b_Q^{(i)},\, H W_K^{(i)} + b_K^{(i)},\, H W_V^{(i)} + b_V^{(i)})",
    symbols=(
        Symbol("H", "(T, d_model)", "the input rows"),
        Symbol(r"[W_Q \mid W_K \mid W_V]", "(d_model, 3 h d_k)",
               "the query, key and value maps of all heads side by side (attn.w_qkv)"),
        Symbol(r"[b_Q \mid b_K \mid b_V]", "(3 h d_k,)",
               "their biases (attn.b_qkv; zero when config.attn_bias is false)"),
        Symbol(r"W_Q^{(i)}, W_K^{(i)}, W_V^{(i)}", "(d_model, d_k)",
               "head i's query, key and value maps: columns (i−1)d_k + 1 … i d_k of W_Q, "
               "W_K, W_V (split_heads)"),
        Symbol(r"b_Q^{(i)}, b_K^{(i)}, b_V^{(i)}", "(d_k,)", "the same entries of b_Q, b_K, b_V"),
        Symbol("W_O", "(h d_k, d_model)",
               "the output map from the concatenated heads to the residual stream (attn.w_o)"),
        Symbol("b_O", "(d_model,)", "its bias (attn.b_o)"),
        Symbol("h", "()", "number of heads; d_k = d_model / h unless the head width is free"),
        Symbol(r"\mathrm{head}_i", "(T, d_k)", "head i's output, i = 1, …, h"),
        Symbol(r"\operatorname{MultiHead}(H)", "(T, d_model)", "the attention sub-layer's output"),
    ),
    sources=(Source(BLUEPRINT, "eqs 4–5"), Source(VASWANI_2017, "sec. 3.2.2"),
             Source(NOTES, "sec. 3.1"), Source(RADFORD_2019, "sec. 2.3"),
             Source(BROWN_2020, "sec. 2.1")),
    reference="multi_head_attention",
    tolerance=Tolerance(r"\lambda\left(\sqrt{d_{\mathrm{model}}}\,u\,(|\operatorname{Concat}|\,|W_O| "
                        r"+ |b_O|) \oplus \sqrt{\varepsilon_{\mathrm{Concat}}^2\,W_O^2} \oplus "
                        r"u\,|\operatorname{MultiHead}(H)|\right)",
                        reduction="d_model",
                        note="linear's budget for the output projection (n = h·d_k = d_model, +1 for the "
                             "bias), with ε_Concat the heads' error scales: the QKV projection's budget "
                             "carried through the scores, softmax and A V stages "
                             "(budgets.multi_head_attention_bound), squares entry by entry; the longest "
                             "inner sum is over d_model (or T if longer); its check: projection → "
                             "attention per head → W_O, propagated"),
    decisions=(MULTI_HEAD, QKV_BIASES, MODIFIED_SOFTMAX, HEAD_WIDTH),
    sympy_inputs=(("H", "(T, d_model)"), ("W_qkv", "(d_model, 3*h*d_k)"),
                  ("b_qkv", "(1, 3*h*d_k)"), ("W_O", "(h*d_k, d_model)"),
                  ("b_O", "(1, d_model)"), ("n_heads", "int h")),
)
def multi_head_attention(H: sp.Matrix, W_qkv: sp.Matrix, b_qkv: sp.Matrix | None,
                         W_O: sp.Matrix, b_O: sp.Matrix | None, n_heads: int) -> sp.Matrix:
    Q, K, V = qkv_projection.sympy(H, W_qkv, b_qkv)
    M = causal_mask.sympy(H.rows)
    heads = [scaled_dot_product_attention.sympy(Q_i, K_i, V_i, M)
             for Q_i, K_i, V_i in zip(split_heads.sympy(Q, n_heads), split_heads.sympy(K, n_heads),
                                      split_heads.sympy(V, n_heads), strict=True)]
    return linear.sympy(merge_heads.sympy(heads), W_O, b_O)


@equation(
    id="multi_head_attention_head_sum",
    title="Multi-head attention as a sum over heads",
    group="attention",
    latex=r"\operatorname{MultiHead}(H) = \sum_{i=1}^{h} \mathrm{head}_i\, W_O^{(i)} + b_O,"
          r"\qquad W_O^{(i)} = (W_O)_{(i-1) d_k + 1 \,\ldots\, i\, d_k,\;:}",
    symbols=(
        Symbol("H", "(T, d_model)", "the input rows"),
        Symbol(r"\mathrm{head}_i", "(T, d_k)", "head i's attention output"),
        Symbol("W_O^{(i)}", "(d_k, d_model)", "the rows of W_O that read head i"),
        Symbol("b_O", "(d_model,)", "attn.b_o"),
    ),
    sources=(Source(NOTES, "sec. 3.1 (each head writes into the residual stream)"),
             Source(BLUEPRINT, "eq 4"), Source(VASWANI_2017, "sec. 3.2.2")),
    reference="multi_head_attention_head_sum",
    tolerance=Tolerance(r"\lambda\left(\sqrt{d_{\mathrm{model}}}\,u\,\big(\textstyle\sum_i "
                        r"|\mathrm{head}_i|\,|W_O^{(i)}| + |b_O|\big) \oplus "
                        r"\sqrt{\varepsilon_{\mathrm{Concat}}^2\,W_O^2} \oplus "
                        r"u\,|\operatorname{MultiHead}(H)|\right)",
                        reduction="d_model",
                        note="multi_head_attention's budget: the sum of the row blocks' products is the "
                             "product with the concatenation, with the same inner lengths; its check: as "
                             "multi_head_attention (the per-head sum has the same inner lengths)"),
    notes="Equal to multi_head_attention: multiplying the concatenation [head_1 | … | head_h] "
          "by W_O cut into h row blocks is the sum of the block products. The Notes read each "
          "head as adding its own contribution to the residual stream.",
    sympy_inputs=(("H", "(T, d_model)"), ("W_qkv", "(d_model, 3*h*d_k)"),
                  ("b_qkv", "(1, 3*h*d_k)"), ("W_O", "(h*d_k, d_model)"),
                  ("b_O", "(1, d_model)"), ("n_heads", "int h")),
)
def multi_head_attention_head_sum(H: sp.Matrix, W_qkv: sp.Matrix, b_qkv: sp.Matrix | None,
                                  W_O: sp.Matrix, b_O: sp.Matrix | None, n_heads: int
                                  ) -> sp.Matrix:
    Q, K, V = qkv_projection.sympy(H, W_qkv, b_qkv)
    M = causal_mask.sympy(H.rows)
    d_k = W_O.rows // n_heads
    out = sp.zeros(H.rows, W_O.cols)
    for i, (Q_i, K_i, V_i) in enumerate(zip(split_heads.sympy(Q, n_heads),
                                            split_heads.sympy(K, n_heads),
                                            split_heads.sympy(V, n_heads), strict=True)):
        head_i = scaled_dot_product_attention.sympy(Q_i, K_i, V_i, M)
        out += head_i * W_O[i * d_k:(i + 1) * d_k, :]
    return out if b_O is None else out + _each_row(b_O, H.rows)
