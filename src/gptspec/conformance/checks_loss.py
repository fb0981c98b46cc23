"""Checks of the loss group (spec/loss.py, reference/loss.py): the mean cross-entropy
against the reference. A logit error e moves the loss by at most 2·max e (log-softmax is
2-Lipschitz in the largest entry), plus its own reductions' rounding."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from gptspec import reference as ref
from gptspec.conformance import budgets as B
from gptspec.conformance.cases import (
    MODEL_SHARE,
    drawn_training_case,
)
from gptspec.conformance.registry import check
from gptspec.conformance.strategies import model_cases


@check("cross_entropy_mean.differential", entries=("cross_entropy_mean", "cross_entropy_sum",
                                                  "log_softmax"),
       ops=("gpt_backward",), depends_on=("gpt_forward.differential",), area="training",
       budget="λ·((2·max(logit error) + √(N·V)·u_acc·|L|) ⊕ u·|L|)")
def loss(backend, ctx):
    """The loss equals −log of the reference's probabilities: the backend's mean
    cross-entropy equals −(1/N) Σ_t log P_ref(y_t | x_≤t), with P_ref the reference's
    ``next_token_distribution`` of its logits; N times it is the Blueprint's eq 10 sum
    −Σ_t log P_ref(y_t | x_≤t), within N times the budget. log P_ref is taken as the
    reference's ``log_softmax`` (the same number), since log of a probability that
    underflows to 0 (a logit gap past 745) would be −∞ where a correct loss is finite."""
    @ctx.given(case=model_cases(ctx.precision.dtype, share=MODEL_SHARE), data=st.data())
    def _(case, data):
        config, params, tokens, targets = drawn_training_case(case, ctx.precision.dtype, data)
        log_probs = ref.log_softmax(ref.gpt_forward(tokens, params, config))
        picked = np.take_along_axis(log_probs, targets[..., None], -1)
        expected = -np.mean(picked)
        got, _ = ctx.op("gpt_backward")(tokens, targets, params, config)
        logit_error = float(np.max(B.gpt_forward_bound(tokens, params, config, ctx.precision)))
        # the loss may be returned in the dtype: one more rounding, u·|L|
        scale = np.hypot(2 * logit_error + ctx.precision.sum_scale(log_probs.size) * abs(expected),
                         ctx.precision.store(expected))
        ctx.record("loss", B.compare(np.float64(got), expected, B.budget(scale)))
        N = targets.size
        ctx.record("N · loss vs the eq 10 sum",
                   B.compare(N * np.float64(got), -np.sum(picked), N * B.budget(scale)))
