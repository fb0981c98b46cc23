"""The blocks and the whole model against the reference; batch independence and
dimensionality. The whole-model checks need nothing but ``backend.forward``.

Sizes: a quarter of the configurations are big in one concern (strategies.MODEL_CONCERNS):
a context of a block-boundary length up to 1025, one or two heads of a real width (64 to
128, or an odd one), or a vocabulary of 1025 to 65537 with ids past 2¹⁶. Every run also
checks a GPT-2-small-shaped model at T = 1024 (``gpt_forward.gpt2_small``). The
reference's logits and their budget are computed once per case and dtype and shared by
the checks that draw the same case (``reference_case``).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
from hypothesis import strategies as st

from gptspec import reference as ref
from gptspec.conformance import budgets as B
from gptspec.conformance.context import declared_support
from gptspec.conformance.protocol import NotApplicable
from gptspec.conformance.registry import check
from gptspec.conformance.strategies import (
    ParameterRecipe,
    arrays,
    configs,
    model_cases,
    parameter_recipes,
    sequence_lengths,
)
from gptspec.reference.block import BLOCK, block_parameters
from gptspec.reference.embedding import embed
from gptspec.spec.config import PRESETS, GPTConfig

# Big model cases cost a big reference each: a quarter of the cases (7 or 8 at the
# default profile, spread over the three concerns).
MODEL_SHARE = 1 / 4
MODEL = "every stage's roundings propagated through the model (budgets.gpt_forward_bound)"
BLOCK_OPS = {"pre": "block_pre_ln", "post": "block_post_ln", "guide": "block_guide"}


def _rounded(recipe, dtype: str) -> dict[str, np.ndarray]:
    return {k: B.round_to(v, dtype) for k, v in recipe.make().items()}


@functools.lru_cache(maxsize=4)
def _reference(config: GPTConfig, recipe: ParameterRecipe, dtype: str, shape: tuple[int, ...],
               ids: bytes) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    tokens = np.frombuffer(ids, dtype=np.int64).reshape(shape)
    params = _rounded(recipe, dtype)
    return (params, ref.gpt_forward(tokens, params, config),
            B.gpt_forward_bound(tokens, params, config, B.Precision.of(dtype)))


def reference_case(config: GPTConfig, recipe: ParameterRecipe, tokens: np.ndarray,
                   dtype: str) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The parameters rounded to ``dtype``, the reference's logits and their error scale
    (budgets.gpt_forward_bound), cached: the model checks draw the same cases, and a big
    case's reference is the expensive part of its example. Callers must not modify the
    arrays. Sequences are independent, so row b of the logits and of the scale is also
    that of the sequence alone."""
    tokens = np.ascontiguousarray(tokens, dtype=np.int64)
    return _reference(config, recipe, dtype, tokens.shape, tokens.tobytes())


def _block_check(norm: str):
    name = BLOCK_OPS[norm]
    ffn_checks = tuple(f"ffn_{v}.differential" for v in ("relu", "gelu", "gelu_tanh",
                                                        "guide_product"))

    @check(f"{name}.differential", entries=name, ops=(name,),
           depends_on=("multi_head_attention.differential", "layer_norm.differential",
                       *ffn_checks),
           budget="LayerNorm, attention and FFN budgets propagated through the block")
    def block(backend, ctx):
        p = ctx.precision

        @ctx.given(config=configs(max_layers=1, norms=(norm,), share=MODEL_SHARE,
                                  concerns=("context", "head_width")), data=st.data())
        def _(config, data):
            recipe = data.draw(parameter_recipes(config, p.dtype))
            bp = block_parameters(_rounded(recipe, p.dtype), 0)
            T = data.draw(sequence_lengths(config.n_ctx), label="T")
            H = B.round_to(data.draw(arrays((T, config.d_model), p.dtype)), p.dtype)
            y, e = B.block_bound(H, 0 * H, bp, config, p)
            out = ctx.op(name)(H, bp, config)
            ctx.record(name, B.compare(out, y, B.budget(e)))

    block.__doc__ = f"One {norm} block, every FFN variant, against the reference."
    return block


block_pre_ln = _block_check("pre")
block_post_ln = _block_check("post")
block_guide = _block_check("guide")


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
        params = _rounded(recipe, p.dtype)
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


# GPT-2 small's shapes with one block: the blocks are alike, and one keeps the run's time
GPT2_SMALL = dataclasses.replace(PRESETS["gpt2"], n_layers=1)
GPT2_SCALE = 0.02  # GPT-2's initialisation
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


def require_supported(backend, config: GPTConfig) -> None:
    """For a check of one fixed configuration (no drawn examples for the context to
    skip): NotApplicable where the backend's ``supports`` declares it cannot express it."""
    supports = declared_support(backend)
    reason = supports(config) if supports is not None else None
    if reason:
        raise NotApplicable(str(reason))


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
    params = _rounded(recipe, p.dtype)
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
