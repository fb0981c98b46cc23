"""Checks of the block group (spec/block.py, reference/block.py): LayerNorm, the
activations and feed-forward networks against the reference, the three residual forms as
whole blocks, and residual identity (the Notes' third "next check")."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from gptspec.conformance import budgets as B
from gptspec.conformance.cases import (
    BLOCK_OPS,
    MODEL_SHARE,
    ROW_WISE_SHARE,
    check_against,
    draw_rounded,
    matrix_dims,
    rounded_parameters,
)
from gptspec.conformance.registry import check
from gptspec.conformance.strategies import (
    BOUNDARY_LENGTHS,
    EDGE_FLAVOURS,
    FLAVOURS,
    HEAD_WIDTHS,
    arrays,
    configs,
    edge_scale,
    model_cases,
    parameter_recipes,
    sequence_lengths,
    shapes,
    token_arrays,
)
from gptspec.reference.block import block_parameters
from gptspec.reference.embedding import embed


@check("layer_norm.differential", entries="layer_norm", ops=("layer_norm",),
       budget="λ·(δx̂ from the roundings of μ and σ², s(n)·u each with s(n) = max(√n, "
              "(n − 1)/λ), and of the root) "
              "(budgets.layer_norm_bound)")
def layer_norm(backend, ctx):
    """γ ⊙ (x − μ)/√(σ² + ε) + β, tiny variances included, rows longer than 1024, and
    magnitudes up to the edge of the dtype's range (float16: 65504) and down to its
    subnormals."""
    @ctx.given(dims=matrix_dims(max_d=32, share=ROW_WISE_SHARE),
               eps=st.sampled_from((1e-5, 1e-6, 1e-3)), data=st.data())
    def _(dims, eps, data):
        x = draw_rounded(data, dims, ctx, FLAVOURS + EDGE_FLAVOURS,
                  edge=edge_scale(ctx.precision.dtype, 4 * dims[-1], 2))
        g = draw_rounded(data, dims[-1:], ctx, flavours=("normal",))
        b = draw_rounded(data, dims[-1:], ctx, flavours=("normal",))
        y, e = B.layer_norm_bound(x, 0 * x, g, b, eps, ctx.precision)
        check_against(ctx, "layer_norm", (x, g, b, eps), y, e)


def _activation_check(name: str):
    @check(f"{name}.differential", entries=name, ops=(name,),
           budget=f"λ·{B.ROUNDINGS[name]}·u(|x| + |y|) (its evaluation's roundings) ⊕ u|y|")
    def activation(backend, ctx):
        @ctx.given(dims=matrix_dims(), data=st.data())
        def _(dims, data):
            x = draw_rounded(data, dims, ctx, scale=3.0)
            y, e = B.activation_bound(name, x, 0 * x, ctx.precision)
            check_against(ctx, name, (x,), y, e)

    activation.__doc__ = f"{name} elementwise, against the reference's formula."
    return activation


relu = _activation_check("relu")


gelu = _activation_check("gelu")


gelu_tanh = _activation_check("gelu_tanh")


def _ffn_check(variant: str):
    name = f"ffn_{variant}"
    act = "relu" if variant == "guide_product" else variant

    @check(f"{name}.differential", entries=name, ops=(name,),
           depends_on=("linear.differential", f"{act}.differential"),
           budget="W_1 → activation → W_2 (or the product), propagated (budgets.ffn_bound)")
    def ffn(backend, ctx):
        @ctx.given(dims=shapes((6, 16, 32), (BOUNDARY_LENGTHS, HEAD_WIDTHS + (768, 1025),
                                             BOUNDARY_LENGTHS)), data=st.data())
        def _(dims, data):
            T, d, f = dims
            f = d if variant == "guide_product" else f
            x = draw_rounded(data, (T, d), ctx)
            W1, W2 = draw_rounded(data, (d, f), ctx, scale=0.3), draw_rounded(data, (f, d), ctx, scale=0.3)
            b1, b2 = draw_rounded(data, (f,), ctx), draw_rounded(data, (d,), ctx)
            y, e = B.ffn_bound(variant, x, 0 * x, W1, b1, W2, b2, ctx.precision)
            check_against(ctx, name, (x, W1, b1, W2, b2), y, e)

    ffn.__doc__ = f"The {variant} feed-forward network, against the reference."
    return ffn


ffn_relu = _ffn_check("relu")


ffn_gelu = _ffn_check("gelu")


ffn_gelu_tanh = _ffn_check("gelu_tanh")


ffn_guide_product = _ffn_check("guide_product")


def _zero_branch_outputs(bp: dict, norm: str) -> dict:
    """Zero the maps that write a block's branches into the residual stream: W_O, b_O and
    W_2, b_2 (for the Guide's product, W_2 and b_2 zero the second factor)."""
    zeroed = dict(bp)
    for name in ("attn.w_o", "attn.b_o", "ffn.w_2", "ffn.b_2"):
        if name in zeroed:
            zeroed[name] = np.zeros_like(zeroed[name])
    return zeroed


@check("residual.identity", entries=("block_pre_ln", "block_post_ln", "block_guide"),
       kind="property", budget="exact for pre-LN; the LayerNorm budget for post-LN and the Guide",
       # its whole-model part reads the block through these maps: one of them broken is
       # reported as itself, not as the block (a skipped final LayerNorm was)
       depends_on=("token_embedding.differential", "positional_embedding.differential",
                   "layer_norm.differential", "final_layer_norm.differential",
                   "unembed_tied.differential", "unembed_untied.differential"))
def residual_identity(backend, ctx):
    """Residual identity.

    Precondition: the maps that write into the residual stream are zero (W_O = 0, b_O = 0,
    W_2 = 0, b_2 = 0). Then
    (1) a pre-LN block is the identity, exactly: H + 0 + 0 = H;
    (2) a post-LN block (Blueprint eqs 7–8) is LN_2(LN_1(H)), within LayerNorm's budget;
    (3) the Guide's block is LN(H): its FFN product has a zero factor.
    Checked through the backend's block operations where it has them, and always through
    its whole forward pass: a pre-LN model of identity blocks gives
    unembed(LN_f(W_E[x] + W_P)) (or without LN_f).
    """
    p = ctx.precision

    @ctx.given(case=model_cases(ctx.precision.dtype, max_layers=1), data=st.data())
    def _(case, data):
        config, recipe, tokens = case
        params = {k: B.round_to(v, p.dtype) for k, v in recipe.make().items()}
        bp = _zero_branch_outputs(block_parameters(params, 0), config.norm)
        op = getattr(backend, f"block_{config.norm}_ln" if config.norm != "guide"
                     else "block_guide", None)
        H = B.round_to(data.draw(arrays((tokens.shape[1], config.d_model), p.dtype)), p.dtype)
        if op is None:
            return
        out = np.asarray(op(H, bp, config), dtype=np.float64)
        if config.norm == "pre":
            ctx.record("pre-LN block with zero branch outputs vs H", B.exact(out, H))
            return
        eps = config.ln_eps
        y, e = B.layer_norm_bound(H, 0 * H, bp["ln_1.weight"], bp["ln_1.bias"], eps, p)
        if config.norm == "post":
            y, e = B.layer_norm_bound(y, e, bp["ln_2.weight"], bp["ln_2.bias"], eps, p)
        ctx.record(f"{config.norm} block with zero branch outputs vs LayerNorm",
                   B.compare(out, y, B.budget(e)))

    @ctx.given(config=configs(norms=("pre",)), data=st.data())
    def _(config, data):
        params = {k: B.round_to(v, p.dtype)
                  for k, v in data.draw(parameter_recipes(config, ctx.precision.dtype)).make().items()}
        for layer in range(config.n_layers):
            prefix = f"blocks.{layer}."
            for name, value in _zero_branch_outputs(block_parameters(params, layer), "pre").items():
                params[prefix + name] = value
        tokens = data.draw(token_arrays(config))
        H = embed(tokens, params, config)
        eH = 0 * H  # e alone is a copy, exact
        if config.positional_embedding:
            H, eH = B.add_bound(H, 0 * H, 0 * H, 0 * H, p)  # the one rounding of e + p
        if config.final_norm:
            H, eH = B.layer_norm_bound(H, eH, params["ln_f.weight"], params["ln_f.bias"],
                                       config.ln_eps, p)
        W = params["wte"].T if config.tied_embeddings else params["w_u"]
        y, e = B.linear_bound(H, eH, W, None if config.tied_embeddings else params.get("b_u"), p)
        ctx.record("model of identity blocks vs unembed(LN_f(e + p))",
                   B.compare(backend.forward(tokens, params, config), y, B.budget(e)))


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
            bp = block_parameters(rounded_parameters(recipe, p.dtype), 0)
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
