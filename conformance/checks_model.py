"""The blocks and the whole model against the reference; batch independence and
dimensionality. The whole-model checks need nothing but ``backend.forward``."""

from __future__ import annotations

import numpy as np
from gptspec.conformance import budgets as B
from gptspec.conformance.registry import check
from gptspec.conformance.strategies import arrays, configs, model_cases, parameter_recipes
from gptspec.reference.forward import block_parameters
from hypothesis import strategies as st

from gptspec import reference as ref

MODEL = "every stage's roundings propagated through the model (budgets.gpt_forward_bound)"
BLOCK_OPS = {"pre": "block_pre_ln", "post": "block_post_ln", "guide": "block_guide"}


def _rounded(recipe, dtype: str) -> dict[str, np.ndarray]:
    return {k: B.round_to(v, dtype) for k, v in recipe.make().items()}


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

        @ctx.given(config=configs(max_layers=1, norms=(norm,)), data=st.data())
        def _(config, data):
            recipe = data.draw(parameter_recipes(config, p.dtype))
            bp = block_parameters(_rounded(recipe, p.dtype), 0)
            T = data.draw(st.integers(1, config.n_ctx), label="T")
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
    @ctx.given(case=model_cases(ctx.precision.dtype))
    def _(case):
        config, recipe, tokens = case
        params = _rounded(recipe, ctx.precision.dtype)
        expected = ref.gpt_forward(tokens, params, config)
        scale = B.gpt_forward_bound(tokens, params, config, ctx.precision)
        ctx.record("logits", B.compare(backend.forward(config, params, tokens), expected,
                                       B.budget(scale)))


@check("model.batch_independence", entries="gpt_forward", kind="property",
       depends_on=("gpt_forward.differential",),
       budget="twice the model's budget: each result is within it of the same exact value")
def batch_independence(backend, ctx):
    """Batch independence: the logits of a sequence computed alone equal its logits
    computed inside a batch of other sequences of the same length, within twice the
    model's budget (a backend may change its summation order with the batch size)."""
    @ctx.given(case=model_cases(ctx.precision.dtype), data=st.data())
    def _(case, data):
        config, recipe, batch = case
        params = _rounded(recipe, ctx.precision.dtype)
        b = data.draw(st.integers(0, batch.shape[0] - 1), label="which sequence")
        alone = backend.forward(config, params, batch[b : b + 1])
        together = np.asarray(backend.forward(config, params, batch), dtype=np.float64)[b : b + 1]
        scale = B.gpt_forward_bound(batch[b : b + 1], params, config, ctx.precision)
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

    @ctx.given(case=model_cases(ctx.precision.dtype))
    def _(case):
        config, recipe, tokens = case
        params = _rounded(recipe, p.dtype)
        logits = np.asarray(backend.forward(config, params, tokens))
        B_, T = tokens.shape
        ctx.require(logits.shape == (B_, T, config.vocab_size),
                    f"logits of shape {logits.shape}, expected {(B_, T, config.vocab_size)}")
        op = getattr(backend, BLOCK_OPS[config.norm], None)
        if op is not None:
            H = np.zeros((T, config.d_model)) + 0.5
            out = np.asarray(op(H, block_parameters(params, 0), config))
            ctx.require(out.shape == H.shape,
                        f"{BLOCK_OPS[config.norm]} maps {H.shape} to {out.shape}")
