"""Differential checks of each operation against the float64 reference.

Every check draws inputs (adversarial flavours included, see strategies), rounds them to
the backend's dtype, calls the backend's operation of the reference function's name, and
compares with the reference on the same rounded inputs: exactly for maps that do no
arithmetic, within the derived budget (budgets.py) for the rest. Besides small shapes,
every check draws sizes at real kernels' boundaries (strategies' ``lengths``,
``head_widths``, ``vocab_sizes``, ``shapes``), one axis big at a time where all of them
would make the reference slow. Softmax-like operations and LayerNorm also draw magnitudes
at the edges of the dtype's range (``EDGE_FLAVOURS``), as their spec entries ask.
"""

from __future__ import annotations

import math

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from gptspec import reference as ref
from gptspec.conformance import budgets as B
from gptspec.conformance.registry import check
from gptspec.conformance.strategies import (
    BOUNDARY_LENGTHS,
    EDGE_FLAVOURS,
    FLAVOURS,
    HEAD_WIDTHS,
    VOCAB_SIZES,
    arrays,
    edge_scale,
    head_widths,
    lengths,
    shapes,
    token_ids,
    vocab_sizes,
)

EXACT = "exact: the map does no arithmetic, so any rounding is a bug"
LINEAR = "λ·(√n·u·(|x||W| + |b|) ⊕ u|y|), n = d_in (+1 for the bias)"
SOFTMAX = ("λ·y·((4 + s(n))·u ⊕ u|z − max z|), n = row length, s(n) = max(√n, (n − 1)/λ) "
           "(a sum of n terms of one sign)")


# Row-wise maps are cheap at any size: they draw a boundary shape half the time.
ROW_WISE_SHARE = 1 / 2


def _rows(max_n: int = 40, boundary=BOUNDARY_LENGTHS):
    """(rows, n) for a map over rows of length n: 1–8 rows (independent of each other),
    n small or, half the time, at a boundary (where blocked and online kernels split a
    row)."""
    return st.tuples(st.integers(1, 8), lengths(max_n, ROW_WISE_SHARE, boundary=boundary))


def _dims(max_t: int = 8, max_d: int = 24, rows=BOUNDARY_LENGTHS, cols=BOUNDARY_LENGTHS,
          share=None):
    """(T, d): each small, or one of them at a boundary."""
    return shapes((max_t, max_d), (rows, cols), share)


def _draw(data, shape, ctx, flavours=FLAVOURS, scale=1.0, n=None, edge=None) -> np.ndarray:
    """An array of ``shape`` rounded to the backend's dtype (``n``: the inner length the
    "large" flavour leaves room for; ``edge``: the "overflow_edge" flavour's magnitude)."""
    x = data.draw(arrays(tuple(shape), ctx.precision.dtype, flavours, scale, n, edge),
                  label="array")
    return B.round_to(x, ctx.precision.dtype)


def _check_against(ctx, name: str, args: tuple, expected, scale) -> None:
    # Precondition: the exact result is representable in the dtype (a result beyond its
    # largest value correctly overflows to ±∞, and there is nothing to compare).
    assume(B.representable(expected, ctx.precision.dtype))
    actual = ctx.op(name)(*args)
    ctx.record(name, B.compare(actual, expected, B.budget(scale)))


def _check_exact(ctx, name: str, args: tuple, expected) -> None:
    ctx.record(name, B.exact(ctx.op(name)(*args), expected))


# --- embedding ----------------------------------------------------------------------------


@check("one_hot.differential", entries="one_hot", ops=("one_hot",), budget=EXACT)
def one_hot(backend, ctx):
    """one_hot(x, V) equals the reference exactly: row t is the indicator of x_t."""
    @ctx.given(V=vocab_sizes(30), data=st.data())
    def _(V, data):
        tokens = data.draw(token_ids(V))
        _check_exact(ctx, "one_hot", (tokens, V), ref.one_hot(tokens, V))


@check("token_embedding.differential", entries="token_embedding", ops=("token_embedding",),
       budget=EXACT)
def token_embedding(backend, ctx):
    """token_embedding(x, W_E) selects rows of W_E exactly."""
    # a lookup is cheap at any size: a boundary shape half the time, like the row-wise maps
    @ctx.given(dims=shapes((30, 16), (VOCAB_SIZES, BOUNDARY_LENGTHS), ROW_WISE_SHARE),
               data=st.data())
    def _(dims, data):
        V, d = dims
        W = _draw(data, (V, d), ctx)
        tokens = data.draw(token_ids(V))
        _check_exact(ctx, "token_embedding", (tokens, W), ref.token_embedding(tokens, W))


@check("token_embedding_one_hot.differential", entries="token_embedding_one_hot",
       ops=("token_embedding_one_hot",), budget=EXACT + " (a one-hot product adds only zeros)")
def token_embedding_one_hot(backend, ctx):
    """X W_E with one-hot rows X equals the reference exactly."""
    @ctx.given(dims=shapes((30, 16), (VOCAB_SIZES, BOUNDARY_LENGTHS)), data=st.data())
    def _(dims, data):
        V, d = dims
        W = _draw(data, (V, d), ctx)
        tokens = data.draw(token_ids(V))
        X = ref.one_hot(tokens, V)
        _check_exact(ctx, "token_embedding_one_hot", (X, W), ref.token_embedding_one_hot(X, W))


@check("positional_embedding.differential", entries="positional_embedding",
       ops=("positional_embedding",), budget=EXACT)
def positional_embedding(backend, ctx):
    """positional_embedding(T, W_P) is the first T rows of W_P, exactly."""
    @ctx.given(n_ctx=lengths(16), d=lengths(16), data=st.data())
    def _(n_ctx, d, data):
        W = _draw(data, (n_ctx, d), ctx)
        T = data.draw(lengths(min(n_ctx, 16), 1 / 2,
                              boundary=tuple(b for b in BOUNDARY_LENGTHS if b <= n_ctx)
                              or (n_ctx,)), label="T")
        _check_exact(ctx, "positional_embedding", (T, W), ref.positional_embedding(T, W))


@check("input_representation.differential", entries="input_representation",
       ops=("input_representation",), budget="λ·u|e + p| (one rounding)")
def input_representation(backend, ctx):
    """e + p within one rounding of the sum."""
    @ctx.given(dims=_dims(), data=st.data())
    def _(dims, data):
        E, P = _draw(data, dims, ctx, n=1), _draw(data, dims, ctx, n=1)
        y, e = B.add_bound(E, 0 * E, P, 0 * P, ctx.precision)
        _check_against(ctx, "input_representation", (E, P), y, e)


# --- linear maps and attention ----------------------------------------------------------


@check("linear.differential", entries="linear", ops=("linear",), budget=LINEAR)
def linear(backend, ctx):
    """x W + b within √n·u of the inner products' absolute values."""
    @ctx.given(dims=shapes((8, 24, 24), (BOUNDARY_LENGTHS,) * 3), with_bias=st.booleans(),
               data=st.data())
    def _(dims, with_bias, data):
        T, d_in, d_out = dims
        x = _draw(data, (T, d_in), ctx, n=d_in + 1)
        W = _draw(data, (d_in, d_out), ctx, scale=0.3, n=d_in + 1)
        b = _draw(data, (d_out,), ctx, n=d_in + 1) if with_bias else None
        y, e = B.linear_bound(x, 0 * x, W, b, ctx.precision)
        _check_against(ctx, "linear", (x, W, b), y, e)


@check("qkv_projection.differential", entries="qkv_projection", ops=("qkv_projection",),
       depends_on=("linear.differential",), budget=LINEAR)
def qkv_projection(backend, ctx):
    """Q, K, V = H [W_Q | W_K | W_V] + b, split in three equal column blocks."""
    @ctx.given(dims=_dims(), data=st.data())
    def _(dims, data):
        T, d = dims
        H = _draw(data, (T, d), ctx, n=d + 1)
        W = _draw(data, (d, 3 * d), ctx, scale=0.3, n=d + 1)
        b = _draw(data, (3 * d,), ctx, n=d + 1)
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
        X = _draw(data, (T, h * dk), ctx)
        split = ctx.op("split_heads")(X, h)
        ctx.record("split_heads", B.exact(split, ref.split_heads(X, h)))
        ctx.record("merge_heads", B.exact(ctx.op("merge_heads")(ref.split_heads(X, h)), X))


@check("causal_mask.differential", entries="causal_mask", ops=("causal_mask",), budget=EXACT)
def causal_mask(backend, ctx):
    """M[i, j] = 0 for j ≤ i and −∞ above the diagonal, exactly."""
    @ctx.given(T=lengths(24))
    def _(T):
        _check_exact(ctx, "causal_mask", (T,), ref.causal_mask(T))


@check("softmax.differential", entries="softmax", ops=("softmax",), budget=SOFTMAX)
def softmax(backend, ctx):
    """softmax over the last axis, near-ties and large magnitudes included, up to the
    dtype's overflow edge (float16: 65504) and down to its subnormals."""
    @ctx.given(dims=_rows(boundary=BOUNDARY_LENGTHS + VOCAB_SIZES), data=st.data())
    def _(dims, data):
        z = _draw(data, dims, ctx, FLAVOURS + EDGE_FLAVOURS)
        y, e = B.softmax_bound(z, 0 * z, ctx.precision)
        _check_against(ctx, "softmax", (z,), y, e)


@check("softmax_shifted.differential", entries="softmax_shifted", ops=("softmax_shifted",),
       budget=SOFTMAX + ", with z − c in place of z − max z")
def softmax_shifted(backend, ctx):
    """exp(z − c)/Σ exp(z − c) for a shift c with z − c ≤ 0 (no overflow)."""
    @ctx.given(dims=_rows(), data=st.data())
    def _(dims, data):
        z = _draw(data, dims, ctx, FLAVOURS + EDGE_FLAVOURS)
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
        _check_against(ctx, "softmax_shifted", (z, c), y, e)


def _qkv(data, ctx, T, dk, Tk=None):
    Tk = T if Tk is None else Tk
    return (_draw(data, (T, dk), ctx, n=dk), _draw(data, (Tk, dk), ctx, n=dk),
            _draw(data, (Tk, dk), ctx, n=Tk))


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
    Q = _draw(data, (T, dk), ctx, flavours=("overflow_edge",), edge=edge)
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
        _check_against(ctx, "attention_scores", (Q, K, M), ref.attention_scores(Q, K, M), scale)

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
        _check_against(ctx, "attention_weights", (Q, K, M), A, eA)

    @ctx.given(T=lengths(8), dk=head_widths(16), data=st.data())
    def _(T, dk, data):  # scores near the overflow edge, Q Kᵀ past it (attention_scores)
        edge = _scores_at_the_edge(data, ctx, T, dk)
        if edge is not None:
            Q, K = edge
            M = ref.causal_mask(T)
            A, eA, _, _ = B.attention_bound(Q, 0 * Q, K, 0 * K, K, 0 * K, M, ctx.precision)
            _check_against(ctx, "attention_weights", (Q, K, M), A, eA)


@check("scaled_dot_product_attention.differential", entries="scaled_dot_product_attention",
       ops=("scaled_dot_product_attention",), depends_on=("softmax.differential",),
       budget="scores → softmax → A V, propagated (budgets.attention_bound)")
def scaled_dot_product_attention(backend, ctx):
    """softmax(Q Kᵀ/√d_k + M) V, per head, heads as a leading axis."""
    @ctx.given(h=st.integers(1, 3), T=lengths(8), dk=head_widths(12), data=st.data())
    def _(h, T, dk, data):
        Q, K, V = (_draw(data, (h, T, dk), ctx, n=n) for n in (dk, dk, T))
        M = ref.causal_mask(T)
        _, _, O, eO = B.attention_bound(Q, 0 * Q, K, 0 * K, V, 0 * V, M, ctx.precision)
        _check_against(ctx, "scaled_dot_product_attention", (Q, K, V, M), O, eO)

    @ctx.given(T=lengths(8), dk=head_widths(12), data=st.data())
    def _(T, dk, data):  # scores near the overflow edge, Q Kᵀ past it (attention_scores)
        edge = _scores_at_the_edge(data, ctx, T, dk)
        if edge is not None:
            Q, K = edge
            V = _draw(data, (T, dk), ctx, n=T)
            M = ref.causal_mask(T)
            _, _, O, eO = B.attention_bound(Q, 0 * Q, K, 0 * K, V, 0 * V, M, ctx.precision)
            _check_against(ctx, "scaled_dot_product_attention", (Q, K, V, M), O, eO)


def _mha_sizes():
    """(T, h, d_k): T at a boundary, or one or two heads of a real width (not both)."""
    return shapes((8, 4, 6), (BOUNDARY_LENGTHS, (1, 2), HEAD_WIDTHS))


def _mha_inputs(data, ctx, T, h, dk, with_bias):
    """H and the weights, drawn so that Q K V and the scores fit the dtype: two stacked
    products of "large" inputs can pass float16's 65504 in the scores, where the spec
    asks nothing (the SCORES_RANGE decision): an engine that stores S in the dtype gets
    ∞, and NaN from its softmax, where the exact output is finite."""
    d = h * dk
    H = _draw(data, (T, d), ctx)
    W_qkv = _draw(data, (d, 3 * d), ctx, scale=0.3)
    W_O = _draw(data, (d, d), ctx, scale=0.3)
    b_qkv = _draw(data, (3 * d,), ctx, scale=0.3) if with_bias else None
    b_O = _draw(data, (d,), ctx, scale=0.3) if with_bias else None
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
        _check_against(ctx, "multi_head_attention", (*args, h), y, e)


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
        _check_against(ctx, "multi_head_attention_head_sum", (*args, h), y, e)


# --- normalisation and feed-forward ------------------------------------------------------


@check("layer_norm.differential", entries="layer_norm", ops=("layer_norm",),
       budget="λ·(δx̂ from the roundings of μ and σ², s(n)·u each with s(n) = max(√n, "
              "(n − 1)/λ), and of the root) "
              "(budgets.layer_norm_bound)")
def layer_norm(backend, ctx):
    """γ ⊙ (x − μ)/√(σ² + ε) + β, tiny variances included, rows longer than 1024, and
    magnitudes up to the edge of the dtype's range (float16: 65504) and down to its
    subnormals."""
    @ctx.given(dims=_dims(max_d=32, share=ROW_WISE_SHARE),
               eps=st.sampled_from((1e-5, 1e-6, 1e-3)), data=st.data())
    def _(dims, eps, data):
        x = _draw(data, dims, ctx, FLAVOURS + EDGE_FLAVOURS,
                  edge=edge_scale(ctx.precision.dtype, 4 * dims[-1], 2))
        g = _draw(data, dims[-1:], ctx, flavours=("normal",))
        b = _draw(data, dims[-1:], ctx, flavours=("normal",))
        y, e = B.layer_norm_bound(x, 0 * x, g, b, eps, ctx.precision)
        _check_against(ctx, "layer_norm", (x, g, b, eps), y, e)


@check("final_layer_norm.differential", entries="final_layer_norm", ops=("final_layer_norm",),
       depends_on=("layer_norm.differential",), budget="as layer_norm")
def final_layer_norm(backend, ctx):
    """The final LayerNorm is LayerNorm with its own parameters and the configuration's ε
    (drawn like layer_norm's: a backend that fixes its own ε fails)."""
    @ctx.given(dims=_dims(max_d=32), eps=st.sampled_from((1e-5, 1e-6, 1e-3)), data=st.data())
    def _(dims, eps, data):
        x = _draw(data, dims, ctx)
        g, b = _draw(data, dims[-1:], ctx), _draw(data, dims[-1:], ctx)
        y, e = B.layer_norm_bound(x, 0 * x, g, b, eps, ctx.precision)
        _check_against(ctx, "final_layer_norm", (x, g, b, eps), y, e)


def _activation_check(name: str):
    @check(f"{name}.differential", entries=name, ops=(name,),
           budget=f"λ·{B.ROUNDINGS[name]}·u(|x| + |y|) (its evaluation's roundings) ⊕ u|y|")
    def activation(backend, ctx):
        @ctx.given(dims=_dims(), data=st.data())
        def _(dims, data):
            x = _draw(data, dims, ctx, scale=3.0)
            y, e = B.activation_bound(name, x, 0 * x, ctx.precision)
            _check_against(ctx, name, (x,), y, e)

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
            x = _draw(data, (T, d), ctx)
            W1, W2 = _draw(data, (d, f), ctx, scale=0.3), _draw(data, (f, d), ctx, scale=0.3)
            b1, b2 = _draw(data, (f,), ctx), _draw(data, (d,), ctx)
            y, e = B.ffn_bound(variant, x, 0 * x, W1, b1, W2, b2, ctx.precision)
            _check_against(ctx, name, (x, W1, b1, W2, b2), y, e)

    ffn.__doc__ = f"The {variant} feed-forward network, against the reference."
    return ffn


ffn_relu = _ffn_check("relu")
ffn_gelu = _ffn_check("gelu")
ffn_gelu_tanh = _ffn_check("gelu_tanh")
ffn_guide_product = _ffn_check("guide_product")


# --- output ---------------------------------------------------------------------------------


@check("unembed_tied.differential", entries="unembed_tied", ops=("unembed_tied",),
       depends_on=("linear.differential",), budget=LINEAR + ", W = W_Eᵀ")
def unembed_tied(backend, ctx):
    """H W_Eᵀ: the output map is the embedding, transposed."""
    @ctx.given(sizes=shapes((8, 16, 30), (BOUNDARY_LENGTHS, BOUNDARY_LENGTHS, VOCAB_SIZES)),
               data=st.data())
    def _(sizes, data):
        *dims, V = sizes
        H = _draw(data, dims, ctx)
        W_E = _draw(data, (V, dims[1]), ctx, scale=0.3)
        y, e = B.linear_bound(H, 0 * H, W_E.T, None, ctx.precision)
        _check_against(ctx, "unembed_tied", (H, W_E), y, e)


@check("unembed_untied.differential", entries="unembed_untied", ops=("unembed_untied",),
       depends_on=("linear.differential",), budget=LINEAR)
def unembed_untied(backend, ctx):
    """H W_U + b_U."""
    @ctx.given(sizes=shapes((8, 16, 30), (BOUNDARY_LENGTHS, BOUNDARY_LENGTHS, VOCAB_SIZES)),
               with_bias=st.booleans(), data=st.data())
    def _(sizes, with_bias, data):
        *dims, V = sizes
        H = _draw(data, dims, ctx)
        W_U = _draw(data, (dims[1], V), ctx, scale=0.3)
        b_U = _draw(data, (V,), ctx) if with_bias else None
        y, e = B.linear_bound(H, 0 * H, W_U, b_U, ctx.precision)
        _check_against(ctx, "unembed_untied", (H, W_U, b_U), y, e)


@check("next_token_distribution.differential", entries="next_token_distribution",
       ops=("next_token_distribution",), depends_on=("softmax.differential",), budget=SOFTMAX)
def next_token_distribution(backend, ctx):
    """softmax of each row of logits, vocabularies up to 65537 and logits up to the edge
    of the dtype's range included."""
    @ctx.given(dims=_rows(boundary=VOCAB_SIZES), data=st.data())
    def _(dims, data):
        z = _draw(data, dims, ctx, FLAVOURS + EDGE_FLAVOURS)
        y, e = B.softmax_bound(z, 0 * z, ctx.precision)
        _check_against(ctx, "next_token_distribution", (z,), y, e)


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
        z = _draw(data, (T, V), ctx, scale=3.0)
        tokens = data.draw(token_ids(V, T, T))
        y, e = B.sequence_log_probability_bound(tokens, z, ctx.precision)
        _check_against(ctx, "sequence_log_probability", (tokens, z), y, e)
