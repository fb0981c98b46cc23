"""The named properties: each stated precisely, with its preconditions, in its docstring.

These hold of the mathematics whatever the parameters, so they test a backend without
trusting the reference's arithmetic: embedding round trips, mask causality (the Notes'
second "next check"), residual identity (the third; the first, dimensionality, is
``model.dimensionality`` in checks_model), softmax stability, and the equal head-sum
form of multi-head attention.
"""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from gptspec import reference as ref
from gptspec.conformance import budgets as B
from gptspec.conformance.registry import check
from gptspec.conformance.strategies import (
    arrays,
    configs,
    model_cases,
    parameter_recipes,
    token_arrays,
)
from gptspec.reference.block import block_parameters
from gptspec.reference.embedding import embed

MANTISSA_BITS = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}


@check("embedding.round_trip", entries=("one_hot", "token_embedding",
                                        "token_embedding_one_hot", "unembed_tied"),
       ops=("one_hot", "token_embedding", "token_embedding_one_hot", "unembed_tied"),
       kind="property", budget="exact for the embedding; the argmax needs a margin of "
                               "more than the unembedding's budget")
def embedding_round_trip(backend, ctx):
    """Embedding round trips.

    For every token sequence x and embedding W_E ∈ ℝ^{V×d}:
    (1) the one-hot product equals row selection exactly: one_hot(x) W_E = W_E[x];
    (2) argmax over the rows of one_hot(x) gives back x;
    (3) (the Notes' check) if the rows of W_E have equal norms and are distinct, then
        unembedding the embedding of t with the tied map gives logits whose argmax is t:
        ⟨e_t, e_t⟩ > ⟨e_t, e_s⟩ for s ≠ t by Cauchy–Schwarz. Precondition, so that the
        backend's rounding cannot flip the argmax: the margin ‖e_t‖² − max_{s≠t}⟨e_t, e_s⟩
        exceeds the unembedding's budget.
    """
    @ctx.given(V=st.integers(2, 24), d=st.integers(2, 16), data=st.data())
    def _(V, d, data):
        dt = ctx.precision.dtype
        W = data.draw(arrays((V, d), dt, ("normal",)), label="W_E")
        W = B.round_to(W / np.linalg.norm(W, axis=1, keepdims=True), dt)
        x = np.array(data.draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=10)))
        X = np.asarray(ctx.op("one_hot")(x, V))
        ctx.require(np.array_equal(np.argmax(X, axis=-1), x), "argmax(one_hot(x)) != x")
        E_sel = np.asarray(ctx.op("token_embedding")(x, W), dtype=np.float64)
        E_mat = np.asarray(ctx.op("token_embedding_one_hot")(ref.one_hot(x, V), W),
                           dtype=np.float64)
        ctx.record("one_hot(x) W_E vs W_E[x]", B.exact(E_mat, E_sel))
        gram = W @ W.T
        margin = np.diag(gram)[:, None] - np.where(np.eye(V, dtype=bool), -np.inf, gram)
        _, e = B.linear_bound(W, 0 * W, W.T, None, ctx.precision)
        assume(np.all(margin.min(axis=1) > 2 * B.budget(e).max()))
        logits = np.asarray(ctx.op("unembed_tied")(W[x], W), dtype=np.float64)
        ctx.require(np.array_equal(np.argmax(logits, axis=-1), x),
                    f"argmax(unembed(embed(x))) = {np.argmax(logits, -1).tolist()} != "
                    f"x = {x.tolist()}")


@check("causal_mask.causality", entries=("causal_mask", "attention_weights", "gpt_forward"),
       ops=("attention_weights",), kind="property",
       budget="exact zeros above the diagonal; the row sums within the softmax budget; "
              "the model's logits at positions ≤ i bit-identical")
def mask_causality(backend, ctx):
    """Mask causality.

    (1) The attention weights above the diagonal are exactly zero: A[i, j] = 0 for j > i.
    (2) Each row of A sums to one, within the sum of its entries' budgets plus the sum's
        own rounding.
    (3) For every model and token sequence x, changing the tokens after position i leaves
        the logits at every position ≤ i unchanged, bit for bit: row i of every stage is
        computed from rows ≤ i only, and masked terms contribute exact zeros.
    """
    @ctx.given(T=st.integers(1, 10), dk=st.integers(1, 8), data=st.data())
    def _(T, dk, data):
        dt = ctx.precision.dtype
        Q, K = (B.round_to(data.draw(arrays((T, dk), dt)), dt) for _ in range(2))
        M = ref.causal_mask(T)
        A = np.asarray(ctx.op("attention_weights")(Q, K, M), dtype=np.float64)
        ctx.require(A.shape == (T, T), f"attention weights of shape {A.shape}, expected {(T, T)}")
        above = A[np.triu_indices(T, 1)]
        ctx.require(bool(np.all(above == 0)), f"weights above the diagonal are not zero: "
                                              f"max {np.abs(above).max() if above.size else 0}")
        _, eA, _, _ = B.attention_bound(Q, 0 * Q, K, 0 * K, Q, 0 * Q, M, ctx.precision)
        row_budget = B.budget(eA.sum(axis=-1)) + B.budget(ctx.precision.sum_scale(T))
        ctx.record("row sums of A", B.compare(A.sum(axis=-1), np.ones(T), row_budget))

    @ctx.given(case=model_cases(ctx.precision.dtype), data=st.data())
    def _(case, data):
        config, recipe, tokens = case
        T = tokens.shape[1]
        assume(T >= 2)
        i = data.draw(st.integers(0, T - 2), label="i")
        changed = tokens.copy()
        changed[:, i + 1:] = data.draw(token_arrays(config, tokens.shape[0], T - i - 1),
                                       label="new suffix")
        params = {k: B.round_to(v, ctx.precision.dtype) for k, v in recipe.make().items()}
        a = np.asarray(backend.forward(tokens, params, config), dtype=np.float64)
        b = np.asarray(backend.forward(changed, params, config), dtype=np.float64)
        ctx.record(f"logits at positions ≤ {i} after changing tokens > {i}",
                   B.exact(b[:, : i + 1], a[:, : i + 1]))


def _zero_branch_outputs(bp: dict, norm: str) -> dict:
    """Zero the maps that write a block's branches into the residual stream: W_O, b_O and
    W_2, b_2 (for the Guide's product, W_2 and b_2 zero the second factor)."""
    zeroed = dict(bp)
    for name in ("attn.w_o", "attn.b_o", "ffn.w_2", "ffn.b_2"):
        if name in zeroed:
            zeroed[name] = np.zeros_like(zeroed[name])
    return zeroed


@check("residual.identity", entries=("block_pre_ln", "block_post_ln", "block_guide"),
       kind="property", budget="exact for pre-LN; the LayerNorm budget for post-LN and the Guide")
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


@check("softmax.stability", entries=("softmax", "softmax_shifted"), ops=("softmax",),
       kind="property", depends_on=("softmax.differential",),
       budget="the softmax budget; finite and in [0, 1] with no budget at all")
def softmax_stability(backend, ctx):
    """Softmax stability.

    (1) Shift invariance: softmax(z + c) = softmax(z) for every c. Checked where z + c is
        exact in the dtype (z on a grid of step ¼, |z| ≤ 8; c a multiple of ¼ up to
        2^(p−3)/4 for p mantissa bits: past exp's overflow point in float16, float32 and
        float64), within the softmax budget.
    (2) No NaN or ∞ for inputs up to half the dtype's largest value: every output is
        finite, in [0, 1], and each row sums to one within the sum's budget.
    (3) The one-hot limit: if z_k exceeds each of the other n − 1 entries by at least G,
        with (n − 1)·e^{−G} < u/4, then softmax(z)_k = 1 within 2u and every other entry
        is at most e^{z_j − z_k}(1 + 4u).
    """
    p = ctx.precision
    sm = ctx.op("softmax")
    bits = MANTISSA_BITS[p.dtype]
    largest = B.LARGEST[p.dtype]

    @ctx.given(n=st.integers(1, 30), data=st.data())
    def _(n, data):
        z = np.array(data.draw(st.lists(st.integers(-32, 32), min_size=n, max_size=n))) / 4.0
        c = data.draw(st.integers(-(2 ** (bits - 3)), 2 ** (bits - 3)), label="c*4") / 4.0
        y, e = B.softmax_bound(z + c, 0 * z, p)
        ctx.record(f"softmax(z + {c}) vs softmax(z)",
                   B.compare(sm(z + c), ref.softmax(z), B.budget(e)))

    @ctx.given(n=st.integers(1, 30), data=st.data())
    def _(n, data):
        fractions = np.array(data.draw(st.lists(st.floats(-0.5, 0.5), min_size=n, max_size=n)))
        z = B.round_to(fractions * largest, p.dtype)
        y = np.asarray(sm(z), dtype=np.float64)
        ctx.require(bool(np.all(np.isfinite(y))), f"softmax of inputs up to max/2 is not "
                                                  f"finite: {y.tolist()}")
        ctx.require(bool(np.all((y >= 0) & (y <= 1))), f"softmax outside [0, 1]: {y.tolist()}")
        ctx.record("sum of softmax(z), |z| ≤ max/2",
                   B.compare(y.sum(), 1.0, B.budget((4 + n) * p.u + p.sum_scale(n))))

    @ctx.given(n=st.integers(2, 30), data=st.data())
    def _(n, data):
        gap = float(np.ceil(np.log(4 * (n - 1) / p.u))) + data.draw(st.integers(0, 20),
                                                                     label="extra gap")
        others = np.array(data.draw(st.lists(st.integers(-40, 0), min_size=n - 1,
                                             max_size=n - 1)), dtype=np.float64)
        k = data.draw(st.integers(0, n - 1), label="k")
        z = np.insert(others, k, gap)
        y = np.asarray(sm(z), dtype=np.float64)
        ctx.record("softmax(z)_k in the one-hot limit", B.compare(y[k], 1.0, 2 * p.u))
        rest = np.delete(y, k)
        limit = np.exp(others - gap) * (1 + 4 * p.u) + p.tiny
        ctx.require(bool(np.all(rest <= limit)),
                    f"entries off the maximum exceed e^(z_j − z_k): {rest.tolist()}")


@check("attention.head_sum", entries=("multi_head_attention", "multi_head_attention_head_sum"),
       ops=("multi_head_attention", "multi_head_attention_head_sum"), kind="property",
       depends_on=("multi_head_attention.differential",),
       budget="twice the multi-head budget: each form is within it of the same exact value")
def head_sum_equivalence(backend, ctx):
    """Head-sum equivalence: Concat(head_1 … head_h) W_O = Σ_i head_i W_O⁽ⁱ⁾, where W_O⁽ⁱ⁾
    is rows i·d_k … (i+1)·d_k − 1 of W_O (block matrix multiplication). The backend's two
    forms agree within twice the budget of one."""
    p = ctx.precision

    @ctx.given(T=st.integers(1, 8), h=st.integers(1, 4), dk=st.integers(1, 6), data=st.data())
    def _(T, h, dk, data):
        d = h * dk
        H = B.round_to(data.draw(arrays((T, d), p.dtype)), p.dtype)
        W_qkv = B.round_to(data.draw(arrays((d, 3 * d), p.dtype, scale=0.3)), p.dtype)
        W_O = B.round_to(data.draw(arrays((d, d), p.dtype, scale=0.3)), p.dtype)
        b_qkv, b_O = np.zeros(3 * d), np.zeros(d)
        _, e = B.multi_head_attention_bound(H, 0 * H, W_qkv, b_qkv, W_O, b_O, h, p)
        concat = ctx.op("multi_head_attention")(H, W_qkv, b_qkv, W_O, b_O, h)
        summed = ctx.op("multi_head_attention_head_sum")(H, W_qkv, b_qkv, W_O, b_O, h)
        ctx.record("Concat(heads) W_O vs Σ head_i W_O^(i)",
                   B.compare(summed, concat, 2 * B.budget(e)))
