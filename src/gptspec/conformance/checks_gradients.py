"""Checks of the gradients group (spec/gradients.py, reference/gradients.py): every
parameter's gradient by name, through the optional operation ``gpt_backward``, at drawn
model cases and on one long batch of GPT-2-small widths.

Budgets: a gradient's error is propagated stage by stage through the backward pass
(:func:`gradient_budgets.gpt_backward_bound`), which sees what one scale for the whole
model cannot: LayerNorm's backward amplifies errors by |γ|/s, compounding through the
layers.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from hypothesis import strategies as st

from gptspec import reference as ref
from gptspec.conformance import budgets as B
from gptspec.conformance.cases import (
    GPT2_SCALE,
    GPT2_SMALL,
    MODEL_SHARE,
    drawn_training_case,
    require_supported,
)
from gptspec.conformance.gradient_budgets import gpt_backward_bound
from gptspec.conformance.registry import check
from gptspec.conformance.strategies import ParameterRecipe, model_cases, text_like_ids
from gptspec.spec import GPTConfig

GRADIENT_ENTRIES = ("cross_entropy_gradient", "linear_backward", "token_embedding_backward",
                    "positional_embedding_backward", "input_representation_backward",
                    "tied_embedding_accumulation", "unembed_tied_backward",
                    "unembed_untied_backward", "layer_norm_backward", "softmax_backward",
                    "scaled_dot_product_attention_backward", "multi_head_attention_backward",
                    "relu_backward", "gelu_backward", "gelu_tanh_backward", "ffn_relu_backward",
                    "ffn_gelu_backward", "ffn_gelu_tanh_backward", "ffn_guide_product_backward",
                    "residual_backward", "block_pre_ln_backward", "block_post_ln_backward",
                    "block_guide_backward", "gpt_backward")


# what a pre-LN, GELU, tied GPT-2 block exercises (gpt_backward.long_batch)
LONG_BATCH_ENTRIES = ("cross_entropy_gradient", "linear_backward", "token_embedding_backward",
                      "positional_embedding_backward", "input_representation_backward",
                      "tied_embedding_accumulation", "unembed_tied_backward",
                      "layer_norm_backward", "softmax_backward",
                      "scaled_dot_product_attention_backward",
                      "multi_head_attention_backward", "gelu_tanh_backward",
                      "ffn_gelu_tanh_backward", "residual_backward", "block_pre_ln_backward",
                      "gpt_backward")


@check("gpt_backward.differential", entries=GRADIENT_ENTRIES, ops=("gpt_backward",),
       depends_on=("gpt_forward.differential",), area="training",
       budget="λ × the error scale propagated through the reference's backward pass stage "
              "by stage (gradient_budgets.gpt_backward_bound)")
def gradients(backend, ctx):
    """Every gradient against the reference's hand-written backward pass, by parameter
    name: the backend's ∂L/∂θ of the mean cross-entropy equals ``gpt_backward``'s for
    every parameter of the schema, over configurations of every variant.

    Precondition: d_model ≥ 2. Over a single feature LayerNorm's output is exactly β
    (x − μ = 0), so the exact gradient of its gain is 0 while a backend's is rounding
    noise amplified by 1/√ε — a property of the model, not of the backend."""
    @ctx.given(case=model_cases(ctx.precision.dtype, share=MODEL_SHARE)
               .filter(lambda c: c[0].d_model >= 2),
               data=st.data())
    def _(case, data):
        config, params, tokens, targets = drawn_training_case(case, ctx.precision.dtype, data)
        _compare_gradients(ctx, tokens, targets, params, config)


def _compare_gradients(ctx, tokens, targets, params, config: GPTConfig) -> None:
    """The backend's gradients against the reference's, by parameter name, each within
    its stage-by-stage budget (gradient_budgets.gpt_backward_bound)."""
    _, expected = ref.gpt_backward(tokens, targets, params, config)
    _, grads = ctx.op("gpt_backward")(tokens, targets, params, config)
    ctx.require(set(grads) == set(expected),
                f"gradients named {sorted(set(grads) ^ set(expected))} do not match the schema")
    scales = gpt_backward_bound(tokens, targets, params, config, ctx.precision)
    for name, g in expected.items():
        ctx.record(name, B.compare(grads[name], g, B.budget(scales[name][1])))


# Long enough that a sum over the rows or over a token's repeats is where a 16-bit
# gradient drifts: 2048 rows, the commonest token at about 500 of them; two heads of
# width 64 over 1024 keys, and a vocabulary one past a tile of 1024.
LONG_BATCH = dataclasses.replace(GPT2_SMALL, d_model=128, n_heads=2, d_ff=512,
                                 vocab_size=1025)


LONG_BATCH_SIZE = 2


@check("gpt_backward.long_batch", entries=LONG_BATCH_ENTRIES, ops=("gpt_backward",),
       depends_on=("gpt_forward.differential",), area="training",
       budget="λ × the error scale propagated through the reference's backward pass stage "
              "by stage (gradient_budgets.gpt_backward_bound)")
def long_batch_gradients(backend, ctx):
    """Every gradient by parameter name over a batch of 2 × 1024 tokens as skewed as a
    text's, in a GPT-2-shaped block (pre-LN, GELU, tied, biases) of width 128: the sums
    over rows (∂γ, ∂β, ∂b, ∂W_P) and over a token's repeats (∂W_E) run 2048 and about 500
    terms long. Hypothesis's examples are mostly short; a sum that a backend accumulates in
    its 16-bit dtype is one rounding off for a few rows and far beyond the budget here.
    Parameters at GPT-2's initialisation scale and tokens come from the run's seed. Not
    applicable where the backend's ``supports`` declines the configuration."""
    p, config = ctx.precision, LONG_BATCH
    require_supported(backend, config)
    params = {k: B.round_to(v, p.dtype)
              for k, v in ParameterRecipe(config, GPT2_SCALE, ctx.seed).make().items()}
    rng = np.random.default_rng(ctx.seed)
    shape = (LONG_BATCH_SIZE, config.n_ctx)
    tokens = text_like_ids(rng, config.vocab_size, math.prod(shape)).reshape(shape)
    targets = np.roll(tokens, -1, axis=1)
    targets[:, -1] = rng.integers(0, config.vocab_size, shape[0])
    _compare_gradients(ctx, tokens, targets, params, config)
