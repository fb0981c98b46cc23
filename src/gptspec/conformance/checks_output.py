"""Checks of the output group (spec/output.py, reference/output.py): the read-out
operations against the reference, and the whole model (``gpt_forward``) through nothing
but ``backend.forward``: against the reference, batch independence, dimensionality (the
Notes' first "next check"), and a GPT-2-small-shaped model at T = 1024."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from gptspec import reference as ref
from gptspec.conformance import budgets as B
from gptspec.conformance.cases import (
    BLOCK_OPS,
    GPT2_SCALE,
    GPT2_SMALL,
    LINEAR,
    MODEL,
    MODEL_SHARE,
    SOFTMAX,
    check_against,
    draw_rounded,
    matrix_dims,
    reference_case,
    require_supported,
    rounded_parameters,
    row_shapes,
)
from gptspec.conformance.registry import check
from gptspec.conformance.strategies import (
    BOUNDARY_LENGTHS,
    EDGE_FLAVOURS,
    FLAVOURS,
    VOCAB_SIZES,
    ParameterRecipe,
    model_cases,
    shapes,
    token_ids,
)
from gptspec.reference.block import BLOCK, block_parameters
from gptspec.reference.embedding import embed
from gptspec.spec.config import GPTConfig


@check("final_layer_norm.differential", entries="final_layer_norm", ops=("final_layer_norm",),
       depends_on=("layer_norm.differential",), budget="as layer_norm")
def final_layer_norm(backend, ctx):
    """The final LayerNorm is LayerNorm with its own parameters and the configuration's ε
    (drawn like layer_norm's: a backend that fixes its own ε fails)."""
    @ctx.given(dims=matrix_dims(max_d=32), eps=st.sampled_from((1e-5, 1e-6, 1e-3)), data=st.data())
    def _(dims, eps, data):
        x = draw_rounded(data, dims, ctx)
        g, b = draw_rounded(data, dims[-1:], ctx), draw_rounded(data, dims[-1:], ctx)
        y, e = B.layer_norm_bound(x, 0 * x, g, b, eps, ctx.precision)
        check_against(ctx, "final_layer_norm", (x, g, b, eps), y, e)


@check("unembed_tied.differential", entries="unembed_tied", ops=("unembed_tied",),
       depends_on=("linear.differential",), budget=LINEAR + ", W = W_Eᵀ")
def unembed_tied(backend, ctx):
    """H W_Eᵀ: the output map is the embedding, transposed."""
    @ctx.given(sizes=shapes((8, 16, 30), (BOUNDARY_LENGTHS, BOUNDARY_LENGTHS, VOCAB_SIZES)),
               data=st.data())
    def _(sizes, data):
        *dims, V = sizes
        H = draw_rounded(data, dims, ctx)
        W_E = draw_rounded(data, (V, dims[1]), ctx, scale=0.3)
        y, e = B.linear_bound(H, 0 * H, W_E.T, None, ctx.precision)
        check_against(ctx, "unembed_tied", (H, W_E), y, e)


@check("unembed_untied.differential", entries="unembed_untied", ops=("unembed_untied",),
       depends_on=("linear.differential",), budget=LINEAR)
def unembed_untied(backend, ctx):
    """H W_U + b_U."""
    @ctx.given(sizes=shapes((8, 16, 30), (BOUNDARY_LENGTHS, BOUNDARY_LENGTHS, VOCAB_SIZES)),
               with_bias=st.booleans(), data=st.data())
    def _(sizes, with_bias, data):
        *dims, V = sizes
        H = draw_rounded(data, dims, ctx)
        W_U = draw_rounded(data, (dims[1], V), ctx, scale=0.3)
        b_U = draw_rounded(data, (V,), ctx) if with_bias else None
        y, e = B.linear_bound(H, 0 * H, W_U, b_U, ctx.precision)
        check_against(ctx, "unembed_untied", (H, W_U, b_U), y, e)


@check("next_token_distribution.differential", entries="next_token_distribution",
       ops=("next_token_distribution",), depends_on=("softmax.differential",), budget=SOFTMAX)
def next_token_distribution(backend, ctx):
    """softmax of each row of logits, vocabularies up to 65537 and logits up to the edge
    of the dtype's range included."""
    @ctx.given(dims=row_shapes(boundary=VOCAB_SIZES), data=st.data())
    def _(dims, data):
        z = draw_rounded(data, dims, ctx, FLAVOURS + EDGE_FLAVOURS)
        y, e = B.softmax_bound(z, 0 * z, ctx.precision)
        check_against(ctx, "next_token_distribution", (z,), y, e)


@check("sequence_log_probability.differential", entries="sequence_log_probability",
       ops=("sequence_log_probability",),
       budget="λ·(√Σ_t (u(|z_t − max| + lse + 4) + s(V))² + s(T − 1)·Σ|log p| ⊕ u·|y|), "
              "s(n) a sum of n terms of one sign")
def sequence_log_probability(backend, ctx):
    """Σ_{t≥2} log softmax(z_{t−1})[x_t], conditioned on the first token."""
    @ctx.given(dims=shapes((8, 20), (BOUNDARY_LENGTHS, VOCAB_SIZES), min_sizes=(1, 2)),
               data=st.data())
    def _(dims, data):
        T, V = dims
        z = draw_rounded(data, (T, V), ctx, scale=3.0)
        tokens = data.draw(token_ids(V, T, T))
        y, e = B.sequence_log_probability_bound(tokens, z, ctx.precision)
        check_against(ctx, "sequence_log_probability", (tokens, z), y, e)


@check("gpt_forward.differential", entries="gpt_forward",
       depends_on=tuple(f"{op}.differential" for op in BLOCK_OPS.values()), budget=MODEL)
def gpt_forward(backend, ctx):
    """The whole model's logits against the reference, over configurations of every
    variant (norm placement, FFN, tied or untied, biases, final LayerNorm)."""
    @ctx.given(case=model_cases(ctx.precision.dtype, share=MODEL_SHARE))
    def _(case):
        config, recipe, tokens = case
        params, expected, scale = reference_case(config, recipe, tokens, ctx.precision.dtype)
        ctx.record("logits", B.compare(backend.forward(tokens, params, config), expected,
                                       B.budget(scale)))


@check("model.batch_independence", entries="gpt_forward", kind="property",
       depends_on=("gpt_forward.differential",),
       budget="twice the model's budget: each result is within it of the same exact value")
def batch_independence(backend, ctx):
    """Batch independence: the logits of a sequence computed alone equal its logits
    computed inside a batch of other sequences of the same length, within twice the
    model's budget (a backend may change its summation order with the batch size)."""
    @ctx.given(case=model_cases(ctx.precision.dtype, share=MODEL_SHARE), data=st.data())
    def _(case, data):
        config, recipe, batch = case
        params, _, full_scale = reference_case(config, recipe, batch, ctx.precision.dtype)
        b = data.draw(st.integers(0, batch.shape[0] - 1), label="which sequence")
        alone = backend.forward(batch[b : b + 1], params, config)
        together = np.asarray(backend.forward(batch, params, config), dtype=np.float64)[b : b + 1]
        scale = full_scale[b : b + 1]
        ctx.record(f"sequence {b} alone vs in a batch of {batch.shape[0]}",
                   B.compare(alone, together, 2 * B.budget(scale)))


@check("model.dimensionality", entries=("gpt_forward", "block_pre_ln", "block_post_ln",
                                        "block_guide"),
       kind="property", budget="shapes: exact")
def dimensionality(backend, ctx):
    """Dimensionality preservation: every block maps (T, d_model) to (T, d_model) (the
    Notes' first check), and the model maps tokens (B, T) to logits (B, T, V), for every
    T ≤ n_ctx. Blocks are checked where the backend exposes them."""
    p = ctx.precision

    @ctx.given(case=model_cases(ctx.precision.dtype, share=MODEL_SHARE))
    def _(case):
        config, recipe, tokens = case
        params = rounded_parameters(recipe, p.dtype)
        logits = np.asarray(backend.forward(tokens, params, config))
        B_, T = tokens.shape
        ctx.require(logits.shape == (B_, T, config.vocab_size),
                    f"logits of shape {logits.shape}, expected {(B_, T, config.vocab_size)}")
        op = getattr(backend, BLOCK_OPS[config.norm], None)
        if op is not None:
            H = np.zeros((T, config.d_model)) + 0.5
            out = np.asarray(op(H, block_parameters(params, 0), config))
            ctx.require(out.shape == H.shape,
                        f"{BLOCK_OPS[config.norm]} maps {H.shape} to {out.shape}")


LOGIT_ROWS = 128  # positions compared at a time: a block of float64 logits is 51 MB


def _reference_hidden(tokens: np.ndarray, params: dict, config: GPTConfig) -> np.ndarray:
    """LN_f(block_L(… block_1(W_E[x] + W_P[:T]))): gpt_forward's composition up to the
    unembedding, from the reference functions of its entries."""
    H = embed(tokens, params, config)
    for layer in range(config.n_layers):
        H = BLOCK[config.norm](H, block_parameters(params, layer), config)
    if config.final_norm:
        H = ref.final_layer_norm(H, params["ln_f.weight"], params["ln_f.bias"], config.ln_eps)
    return H


@check("gpt_forward.gpt2_small", entries="gpt_forward",
       depends_on=("gpt_forward.differential",), budget=MODEL)
def gpt2_small(backend, ctx):
    """A GPT-2-small-shaped model at full length against the reference: d_model 768, 12
    heads of width 64, d_ff 3072, vocabulary 50257, n_ctx 1024, one block, T = 1024,
    batch 1; every kernel at its real size (attention over 1024 keys, the 50257-wide tied
    unembedding, ids up to 50256). Parameters at GPT-2's initialisation scale, made from
    the run's seed, as are the tokens (the vocabulary's top ids among them). Every logit
    is compared, 128 positions at a time. Not applicable where the backend's
    ``supports`` declines the configuration."""
    p, config = ctx.precision, GPT2_SMALL
    require_supported(backend, config)
    recipe = ParameterRecipe(config, GPT2_SCALE, ctx.seed)
    params = rounded_parameters(recipe, p.dtype)
    rng = np.random.default_rng(ctx.seed)
    T, V = config.n_ctx, config.vocab_size
    tokens = rng.integers(0, V, (1, T))
    tokens[0, rng.choice(T, 4, replace=False)] = (V - 1, V - 2, V - 1, 2**15)
    got = np.asarray(backend.forward(tokens, params, config))
    ctx.require(got.shape == (1, T, V), f"logits of shape {got.shape}, expected {(1, T, V)}")
    expected_hidden = _reference_hidden(tokens, params, config)
    _, e_hidden = B.hidden_bound(tokens, params, config, p)
    # the unembedding of the reference's hidden state (W_Eᵀ, or W_U + b_U) is the
    # reference's logits; the budget's blocks compute it beside each block's error scale
    for rows, expected, scale in B.output_bound_blocks(expected_hidden, e_hidden, params,
                                                       config, p, LOGIT_ROWS):
        ctx.record(f"logits at positions {rows.start}…{min(rows.stop, T) - 1}",
                   B.compare(got[:, rows], expected, B.budget(scale)))
