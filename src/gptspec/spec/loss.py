"""Spec entries: the training objective (cross-entropy) and its gradient.

Row t of the logits Z predicts target y_t; Y is the one-hot matrix of the targets
(Y[t, v] = 1 if y_t = v). For causal language modelling y_t = x_{t+1}.
"""

from __future__ import annotations

import sympy as sp

from gptspec.spec.equation import Decision, Reading, Symbol, Tolerance, equation
from gptspec.spec.sources import BLUEPRINT, GUIDE, Source


def _log_softmax_row(z):
    log_total = sp.log(sum(sp.exp(zi) for zi in z))
    return z.applyfunc(lambda zi: zi - log_total)


@equation(
    id="log_softmax",
    title="Log-softmax",
    group="loss",
    latex=r"\log \operatorname{softmax}(z)_i = z_i - \log \sum_{j=1}^{n} e^{z_j}",
    symbols=(Symbol("z", "(n,)", "a row of logits"),),
    sources=(Source(BLUEPRINT, "eq 9"), Source(BLUEPRINT, "eq 10")),
    reference="log_softmax",
    tolerance=Tolerance(r"\lambda \sqrt{n}\,u", reduction="n"),
    notes="Evaluated as (z − max z) − log Σ exp(z − max z), which is the same number "
          "and never overflows.",
    sympy_inputs=(("z", "(1, n)"),),
)
def log_softmax(z):
    return _log_softmax_row(z)


@equation(
    id="cross_entropy_sum",
    title="Cross-entropy loss (the Blueprint's sum)",
    group="loss",
    latex=r"\mathcal{L} = -\sum_{t=1}^{T} \sum_{v=0}^{V-1} Y_{t v}\,"
          r"\log \operatorname{softmax}(Z_{t,:})_v",
    symbols=(
        Symbol("Z", "(T, V)", "logits; row t gives the distribution of the token after position t"),
        Symbol("Y", "(T, V)", "one-hot targets: Y_{tv} = 1 where v = x_{t+1}"),
        Symbol(r"\mathcal{L}", "()", "the summed negative log-likelihood"),
    ),
    sources=(Source(BLUEPRINT, "eq 10"), Source(GUIDE, "sec. 7")),
    reference="cross_entropy_sum",
    tolerance=Tolerance(r"\lambda \sqrt{T V}\,u", reduction="T * V"),
    decisions=(
        Decision(
            question="What is summed: every sequence of the corpus, or one sequence?",
            readings=(
                Reading(Source(BLUEPRINT, "eq 10"),
                        r"a double sum over the corpus $\mathcal{D}$ and positions t"),
                Reading(Source(GUIDE, "sec. 7"),
                        r"$-\sum_{i=1}^{T} \log P(y_i \mid x_{1:i-1})$ over one sequence"),
            ),
            decision="The same sum; a batch of sequences is a subset of the corpus. The sum over "
                     "positions runs over the positions that have a target: row t of Z "
                     "predicts x_{t+1}, so over a sequence x_1, …, x_{T+1} this is "
                     "−Σ_{t=2}^{T+1} log P(x_t | x_{<t}). The first token has no prediction "
                     "(no t = 1 term), as decided for `sequence_log_probability`.",
            why="Both documents write the negative log-likelihood of the observed next tokens.",
        ),
    ),
    sympy_inputs=(("Z", "(T, V)"), ("Y", "(T, V)")),
)
def cross_entropy_sum(Z, Y):
    total = sp.Integer(0)
    for t in range(Z.rows):
        log_p = _log_softmax_row(Z[t, :])
        total -= sum(Y[t, v] * log_p[v] for v in range(Z.cols))
    return total


@equation(
    id="cross_entropy_mean",
    title="Cross-entropy per token",
    group="loss",
    latex=r"\bar{\mathcal{L}} = \frac{1}{N}\, \mathcal{L}(Z, Y), \quad N = T \text{ rows of } Z "
          r"\text{ (} B\,T \text{ in a batch)}",
    symbols=(
        Symbol("Z", "(T, V)", "logits"),
        Symbol("Y", "(T, V)", "one-hot targets"),
        Symbol(r"\mathcal{L}", "()", "the summed loss (cross_entropy_sum)"),
        Symbol("N", "()", "the number of predicted positions"),
        Symbol(r"\bar{\mathcal{L}}", "()", "the loss per predicted position"),
    ),
    sources=(Source(BLUEPRINT, "eq 10"),),
    reference="cross_entropy_mean",
    tolerance=Tolerance(r"\lambda\left(\big(2\max|\varepsilon_Z| + \sqrt{N "
                        r"V}\,u_{\mathrm{acc}}\,|L|\big) \oplus u\,|L|\right)",
                        reduction="T * V",
                        note="ε_Z is the logits' error scale (gpt_forward's budget without λ), which "
                             "moves each log-softmax entry by at most twice its largest value; the "
                             "log-softmax sums over N positions and V logits add √(N V)·u_acc relative "
                             "to the loss, and the loss may be stored in the dtype (u|L|); its check: "
                             "λ·((2·max(logit error) + √(N·V)·u_acc·|L|) ⊕ u·|L|)"),
    decisions=(
        Decision(
            question="Train on the sum of eq 10 or on its mean per token?",
            readings=(Reading(Source(BLUEPRINT, "eq 10"), "the sum over the corpus and positions"),),
            decision="Training minimises the mean over the batch's positions; the sum is "
                     "kept as its own entry.",
            why="The mean has the same minimiser and a scale that does not grow with the "
                "batch, so one learning rate serves every batch size; it is the loss in "
                "nats per token that is reported.",
        ),
    ),
    sympy_inputs=(("Z", "(T, V)"), ("Y", "(T, V)")),
)
def cross_entropy_mean(Z, Y):
    return cross_entropy_sum.sympy(Z, Y) / Z.rows


@equation(
    id="cross_entropy_gradient",
    title="Gradient of the cross-entropy with respect to the logits",
    group="loss",
    latex=r"\frac{\partial \mathcal{L}}{\partial Z_{t,:}} = \operatorname{softmax}(Z_{t,:}) - "
          r"Y_{t,:} \quad \left(\text{divided by } N \text{ for } \bar{\mathcal{L}}\right)",
    symbols=(
        Symbol("Z", "(T, V)", "logits"),
        Symbol("Y", "(T, V)", "one-hot targets"),
        Symbol(r"\mathcal{L}", "()", "the summed loss (cross_entropy_sum)"),
        Symbol("N", "()", "the number of predicted positions, T (B T in a batch)"),
        Symbol(r"\bar{\mathcal{L}}", "()", "the loss per predicted position, L / N"),
    ),
    sources=(Source(BLUEPRINT, "eq 10"), Source(BLUEPRINT, "eq 9")),
    reference="cross_entropy_gradient",
    tolerance=Tolerance(r"\lambda \sqrt{V}\,u", reduction="V"),
    notes="The derivative of cross_entropy_sum with respect to Z; with reduction='mean' it "
          "is divided by the number of positions.",
    sympy_inputs=(("Z", "(T, V)"), ("Y", "(T, V)")),
)
def cross_entropy_gradient(Z, Y, reduction="sum"):
    rows = []
    for t in range(Z.rows):
        e = Z[t, :].applyfunc(sp.exp)
        rows.append(e / sum(e) - Y[t, :])
    grad = sp.Matrix.vstack(*rows)
    return grad / Z.rows if reduction == "mean" else grad
