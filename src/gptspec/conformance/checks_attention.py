"""Checks of the attention group (spec/attention.py, reference/attention.py): each
operation against the reference within its derived budget, at small shapes and at real
kernels' boundaries (lengths, head widths), softmax-like operations also at the edges of
the dtype's range; and the properties that need no reference arithmetic: mask causality
(the Notes' second "next check"), softmax stability, the head-sum form of multi-head
attention."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from gptspec import reference as ref
from gptspec.conformance import budgets as B
from gptspec.conformance.cases import (
    EXACT,
    LINEAR,
    SOFTMAX,
    check_against,
    check_exact,
    draw_rounded,
    matrix_dims,
    row_shapes,
)
from gptspec.conformance.registry import check
from gptspec.conformance.strategies import (
    BOUNDARY_LENGTHS,
    EDGE_FLAVOURS,
    FLAVOURS,
    HEAD_WIDTHS,
    VOCAB_SIZES,
    arrays,
    head_widths,
    lengths,
    model_cases,
    shapes,
    token_arrays,
)


@check("linear.differential", entries="linear", ops=("linear",), budget=LINEAR)
def linear(backend, ctx):
    """x W + b within √n·u of the inner products' absolute values."""
    @ctx.given(dims=shapes((8, 24, 24), (BOUNDARY_LENGTHS,) * 3), with_bias=st.booleans(),
               data=st.data())
    def _(dims, with_bias, data):
        T, d_in, d_out = dims
        x = draw_rounded(data, (T, d_in), ctx, n=d_in + 1)
        W = draw_rounded(data, (d_in, d_out), ctx, scale=0.3, n=d_in + 1)
        b = draw_rounded(data, (d_out,), ctx, n=d_in + 1) if with_bias else None
        y, e = B.linear_bound(x, 0 * x, W, b, ctx.precision)
        check_against(ctx, "linear", (x, W, b), y, e)


@check("qkv_projection.differential", entries="qkv_projection", ops=("qkv_projection",),
       depends_on=("linear.differential",), budget=LINEAR)
def qkv_projection(backend, ctx):
    """Q, K, V = H [W_Q | W_K | W_V] + b, split in three equal column blocks."""
    @ctx.given(dims=matrix_dims(), data=st.data())
    def _(dims, data):
        T, d = dims
        H = draw_rounded(data, (T, d), ctx, n=d + 1)
        W = draw_rounded(data, (d, 3 * d), ctx, scale=0.3, n=d + 1)
        b = draw_rounded(data, (3 * d,), ctx, n=d + 1)
        y, e = B.linear_bound(H, 0 * H, W, b, ctx.precision)
        got = ctx.op("qkv_projection")(H, W, b)
        ctx.require(isinstance(got, (tuple, list)) and len(got) == 3,
                    "qkv_projection must return (Q, K, V)")
        for i, part in enumerate("QKV"):
            cols = slice(i * d, (i + 1) * d)
            ctx.record(f"qkv_projection {part}",
                       B.compare(got[i], y[:, cols], B.budget(e[:, cols])))


@check("split_heads.differential", entries=("split_heads", "merge_heads"),
       ops=("split_heads", "merge_heads"), budget=EXACT)
def split_merge_heads(backend, ctx):
    """split_heads moves column block i to head i; merge_heads is its exact inverse."""
    @ctx.given(T=lengths(8), h=st.integers(1, 4), dk=head_widths(6), data=st.data())
    def _(T, h, dk, data):
        X = draw_rounded(data, (T, h * dk), ctx)
        split = ctx.op("split_heads")(X, h)
        ctx.record("split_heads", B.exact(split, ref.split_heads(X, h)))
        ctx.record("merge_heads", B.exact(ctx.op("merge_heads")(ref.split_heads(X, h)), X))


@check("causal_mask.differential", entries="causal_mask", ops=("causal_mask",), budget=EXACT)
def causal_mask(backend, ctx):
    """M[i, j] = 0 for j ≤ i and −∞ above the diagonal, exactly."""
    @ctx.given(T=lengths(24))
    def _(T):
        check_exact(ctx, "causal_mask", (T,), ref.causal_mask(T))


@check("softmax.differential", entries="softmax", ops=("softmax",), budget=SOFTMAX)
def softmax(backend, ctx):
    """softmax over the last axis, near-ties and large magnitudes included, up to the
    dtype's overflow edge (float16: 65504) and down to its subnormals."""
    @ctx.given(dims=row_shapes(boundary=BOUNDARY_LENGTHS + VOCAB_SIZES), data=st.data())
    def _(dims, data):
        z = draw_rounded(data, dims, ctx, FLAVOURS + EDGE_FLAVOURS)
        y, e = B.softmax_bound(z, 0 * z, ctx.precision)
        check_against(ctx, "softmax", (z,), y, e)


@check("softmax_shifted.differential", entries="softmax_shifted", ops=("softmax_shifted",),
       budget=SOFTMAX + ", with z − c in place of z − max z")
def softmax_shifted(backend, ctx):
    """exp(z − c)/Σ exp(z − c) for a shift c with z − c ≤ 0 (no overflow)."""
    @ctx.given(dims=row_shapes(), data=st.data())
    def _(dims, data):
        z = draw_rounded(data, dims, ctx, FLAVOURS + EDGE_FLAVOURS)
        c = z.max(axis=-1, keepdims=True) + B.round_to(
            data.draw(st.floats(0, 5), label="extra shift"), ctx.precision.dtype)
        y = ref.softmax_shifted(z, c)
        p = ctx.precision
        _, e = B.softmax_bound(z, p.u * np.abs(z - c), p)
        # An exponential below the smallest normal number may be flushed to zero (XLA on
        # the CPU flushes subnormals) or rounded at that absolute floor; dividing by
        # Σ exp(z − c), which the extra shift can make as small as e⁻⁵, scales that floor
        # by 1/Σ, unlike softmax's Σ ≥ 1.
        total = np.sum(np.exp(np.where(np.isfinite(z), z - c, -np.inf)), axis=-1, keepdims=True)
        e = np.hypot(e, p.tiny / total)
        check_against(ctx, "softmax_shifted", (z, c), y, e)


def _qkv(data, ctx, T, dk, Tk=None):
    Tk = T if Tk is None else Tk
    return (draw_rounded(data, (T, dk), ctx, n=dk), draw_rounded(data, (Tk, dk), ctx, n=dk),
            draw_rounded(data, (Tk, dk), ctx, n=Tk))


def _scores_at_the_edge(data, ctx, T, dk):
    """Q and K = Q of magnitude (0.45 … 0.9)·(LARGEST/√d_k)^½: each diagonal score
    Σ_k q_k²/√d_k lies below the dtype's largest value while the unscaled Q Kᵀ, √d_k times
    it, lies past it for d_k ≳ 25 (keys equal to the queries make those sums one-signed).
    Drawn only where Q Kᵀ, and what the softmax forms from S (z − max z: up to twice |S|),
    still fit the format sums are accumulated in: float16, whose products accumulate in
    float32 (the attention_scores entry's decision). None for float32 and float64, whose
    accumulation format is their own, and for bfloat16, whose range is float32's: at
    d_k = 1 its scores of 0.8·LARGEST fit float32 only just, and a fused kernel's
    S·log₂e (FlashAttention's exp2 form) is past it, which the decision does not ask."""
    largest = B.LARGEST[ctx.precision.dtype]
    if largest * max(math.sqrt(dk), 2.0) >= B.LARGEST[B.ACCUMULATION[ctx.precision.dtype]]:
        return None
    edge = 0.9 * math.sqrt(largest / math.sqrt(dk))
    Q = draw_rounded(data, (T, dk), ctx, flavours=("overflow_edge",), edge=edge)
    return Q, Q.copy()


@check("attention_scores.differential", entries="attention_scores", ops=("attention_scores",),
       budget="λ·(√d_k·u·|Q||K|ᵀ/√d_k ⊕ u|S|); masked entries exactly −∞")
def attention_scores(backend, ctx):
    """Q Kᵀ/√d_k + M; masked entries must be exactly −∞. Also scores near the dtype's
    overflow edge whose unscaled product Q Kᵀ lies past it (``_scores_at_the_edge``): the
    spec's S is representable there, so a backend that forms Q Kᵀ in the dtype before
    scaling (∞, then ∞ − ∞ = NaN under the mask) fails."""
    def compare(Q, K, dk):
        M = ref.causal_mask(Q.shape[0])
        S, eS = B.matmul_bound(Q, 0 * Q, K.T, 0 * K.T, ctx.precision)
        scale = B.scores_error(S, eS, Q, K, ctx.precision)
        check_against(ctx, "attention_scores", (Q, K, M), ref.attention_scores(Q, K, M), scale)

    @ctx.given(T=lengths(8), dk=head_widths(16), data=st.data())
    def _(T, dk, data):
        Q, K, _ = _qkv(data, ctx, T, dk)
        compare(Q, K, dk)

    @ctx.given(T=lengths(8), dk=head_widths(16), data=st.data())
    def _(T, dk, data):
        edge = _scores_at_the_edge(data, ctx, T, dk)
        if edge is not None:
            compare(*edge, dk)


@check("attention_weights.differential", entries="attention_weights",
       ops=("attention_weights",), depends_on=("softmax.differential",),
       budget="the scores' error propagated through softmax (budgets.attention_bound)")
def attention_weights(backend, ctx):
    """softmax(Q Kᵀ/√d_k + M) row by row."""
    @ctx.given(T=lengths(8), dk=head_widths(16), data=st.data())
    def _(T, dk, data):
        Q, K, V = _qkv(data, ctx, T, dk)
        M = ref.causal_mask(T)
        A, eA, _, _ = B.attention_bound(Q, 0 * Q, K, 0 * K, V, 0 * V, M, ctx.precision)
        check_against(ctx, "attention_weights", (Q, K, M), A, eA)

    @ctx.given(T=lengths(8), dk=head_widths(16), data=st.data())
    def _(T, dk, data):  # scores near the overflow edge, Q Kᵀ past it (attention_scores)
        edge = _scores_at_the_edge(data, ctx, T, dk)
        if edge is not None:
            Q, K = edge
            M = ref.causal_mask(T)
            A, eA, _, _ = B.attention_bound(Q, 0 * Q, K, 0 * K, K, 0 * K, M, ctx.precision)
            check_against(ctx, "attention_weights", (Q, K, M), A, eA)


@check("scaled_dot_product_attention.differential", entries="scaled_dot_product_attention",
       ops=("scaled_dot_product_attention",), depends_on=("softmax.differential",),
       budget="scores → softmax → A V, propagated (budgets.attention_bound)")
def scaled_dot_product_attention(backend, ctx):
    """softmax(Q Kᵀ/√d_k + M) V, per head, heads as a leading axis."""
    @ctx.given(h=st.integers(1, 3), T=lengths(8), dk=head_widths(12), data=st.data())
    def _(h, T, dk, data):
        Q, K, V = (draw_rounded(data, (h, T, dk), ctx, n=n) for n in (dk, dk, T))
        M = ref.causal_mask(T)
        _, _, O, eO = B.attention_bound(Q, 0 * Q, K, 0 * K, V, 0 * V, M, ctx.precision)
        check_against(ctx, "scaled_dot_product_attention", (Q, K, V, M), O, eO)

    @ctx.given(T=lengths(8), dk=head_widths(12), data=st.data())
    def _(T, dk, data):  # scores near the overflow edge, Q Kᵀ past it (attention_scores)
        edge = _scores_at_the_edge(data, ctx, T, dk)
        if edge is not None:
            Q, K = edge
            V = draw_rounded(data, (T, dk), ctx, n=T)
            M = ref.causal_mask(T)
            _, _, O, eO = B.attention_bound(Q, 0 * Q, K, 0 * K, V, 0 * V, M, ctx.precision)
            check_against(ctx, "scaled_dot_product_attention", (Q, K, V, M), O, eO)


def _mha_sizes():
    """(T, h, d_k): T at a boundary, or one or two heads of a real width (not both)."""
    return shapes((8, 4, 6), (BOUNDARY_LENGTHS, (1, 2), HEAD_WIDTHS))


def _mha_inputs(data, ctx, T, h, dk, with_bias):
    """H and the weights, drawn so that Q K V and the scores fit the dtype: two stacked
    products of "large" inputs can pass float16's 65504 in the scores, where the spec
    asks nothing (the SCORES_RANGE decision): an engine that stores S in the dtype gets
    ∞, and NaN from its softmax, where the exact output is finite."""
    d = h * dk
    H = draw_rounded(data, (T, d), ctx)
    W_qkv = draw_rounded(data, (d, 3 * d), ctx, scale=0.3)
    W_O = draw_rounded(data, (d, d), ctx, scale=0.3)
    b_qkv = draw_rounded(data, (3 * d,), ctx, scale=0.3) if with_bias else None
    b_O = draw_rounded(data, (d,), ctx, scale=0.3) if with_bias else None
    QKV = ref.linear(H, W_qkv, b_qkv)
    Q, K = (ref.split_heads(QKV[..., i * d:(i + 1) * d], h) for i in (0, 1))
    assume(B.representable(QKV, ctx.precision.dtype)
           and B.representable(Q @ np.swapaxes(K, -1, -2) / np.sqrt(dk), ctx.precision.dtype))
    return H, W_qkv, b_qkv, W_O, b_O


@check("multi_head_attention.differential", entries="multi_head_attention",
       ops=("multi_head_attention",),
       depends_on=("qkv_projection.differential", "split_heads.differential",
                   "scaled_dot_product_attention.differential"),
       budget="projection → attention per head → W_O, propagated")
def multi_head_attention(backend, ctx):
    """Concat(head_1 … head_h) W_O + b_O with the causal mask."""
    @ctx.given(sizes=_mha_sizes(), with_bias=st.booleans(), data=st.data())
    def _(sizes, with_bias, data):
        T, h, dk = sizes
        args = _mha_inputs(data, ctx, T, h, dk, with_bias)
        y, e = B.multi_head_attention_bound(args[0], 0 * args[0], *args[1:], h, ctx.precision)
        check_against(ctx, "multi_head_attention", (*args, h), y, e)


@check("multi_head_attention_head_sum.differential", entries="multi_head_attention_head_sum",
       ops=("multi_head_attention_head_sum",), depends_on=("multi_head_attention.differential",),
       budget="as multi_head_attention (the per-head sum has the same inner lengths)")
def multi_head_attention_head_sum(backend, ctx):
    """Σ_i head_i W_O⁽ⁱ⁾ + b_O, the residual-stream form."""
    @ctx.given(sizes=_mha_sizes(), with_bias=st.booleans(), data=st.data())
    def _(sizes, with_bias, data):
        T, h, dk = sizes
        args = _mha_inputs(data, ctx, T, h, dk, with_bias)
        y = ref.multi_head_attention_head_sum(*args, h)
        _, e = B.multi_head_attention_bound(args[0], 0 * args[0], *args[1:], h, ctx.precision)
        check_against(ctx, "multi_head_attention_head_sum", (*args, h), y, e)


MANTISSA_BITS = {"float64": 53, "float32": 24, "float16": 11, "bfloat16": 8}


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
