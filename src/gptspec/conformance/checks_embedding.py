"""Checks of the embedding group (spec/embedding.py, reference/embedding.py): each
operation against the reference, exactly where it does no arithmetic, and the round trip
of one-hot and table-lookup embeddings."""

from __future__ import annotations

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from gptspec import reference as ref
from gptspec.conformance import budgets as B
from gptspec.conformance.cases import (
    EXACT,
    ROW_WISE_SHARE,
    check_against,
    check_exact,
    draw_rounded,
    matrix_dims,
)
from gptspec.conformance.registry import check
from gptspec.conformance.strategies import (
    BOUNDARY_LENGTHS,
    VOCAB_SIZES,
    arrays,
    lengths,
    shapes,
    token_ids,
    vocab_sizes,
)


@check("one_hot.differential", entries="one_hot", ops=("one_hot",), budget=EXACT)
def one_hot(backend, ctx):
    """one_hot(x, V) equals the reference exactly: row t is the indicator of x_t."""
    @ctx.given(V=vocab_sizes(30), data=st.data())
    def _(V, data):
        tokens = data.draw(token_ids(V))
        check_exact(ctx, "one_hot", (tokens, V), ref.one_hot(tokens, V))


@check("token_embedding.differential", entries="token_embedding", ops=("token_embedding",),
       budget=EXACT)
def token_embedding(backend, ctx):
    """token_embedding(x, W_E) selects rows of W_E exactly."""
    # a lookup is cheap at any size: a boundary shape half the time, like the row-wise maps
    @ctx.given(dims=shapes((30, 16), (VOCAB_SIZES, BOUNDARY_LENGTHS), ROW_WISE_SHARE),
               data=st.data())
    def _(dims, data):
        V, d = dims
        W = draw_rounded(data, (V, d), ctx)
        tokens = data.draw(token_ids(V))
        check_exact(ctx, "token_embedding", (tokens, W), ref.token_embedding(tokens, W))


@check("token_embedding_one_hot.differential", entries="token_embedding_one_hot",
       ops=("token_embedding_one_hot",), budget=EXACT + " (a one-hot product adds only zeros)")
def token_embedding_one_hot(backend, ctx):
    """X W_E with one-hot rows X equals the reference exactly."""
    @ctx.given(dims=shapes((30, 16), (VOCAB_SIZES, BOUNDARY_LENGTHS)), data=st.data())
    def _(dims, data):
        V, d = dims
        W = draw_rounded(data, (V, d), ctx)
        tokens = data.draw(token_ids(V))
        X = ref.one_hot(tokens, V)
        check_exact(ctx, "token_embedding_one_hot", (X, W), ref.token_embedding_one_hot(X, W))


@check("positional_embedding.differential", entries="positional_embedding",
       ops=("positional_embedding",), budget=EXACT)
def positional_embedding(backend, ctx):
    """positional_embedding(T, W_P) is the first T rows of W_P, exactly."""
    @ctx.given(n_ctx=lengths(16), d=lengths(16), data=st.data())
    def _(n_ctx, d, data):
        W = draw_rounded(data, (n_ctx, d), ctx)
        T = data.draw(lengths(min(n_ctx, 16), 1 / 2,
                              boundary=tuple(b for b in BOUNDARY_LENGTHS if b <= n_ctx)
                              or (n_ctx,)), label="T")
        check_exact(ctx, "positional_embedding", (T, W), ref.positional_embedding(T, W))


@check("input_representation.differential", entries="input_representation",
       ops=("input_representation",), budget="λ·u|e + p| (one rounding)")
def input_representation(backend, ctx):
    """e + p within one rounding of the sum."""
    @ctx.given(dims=matrix_dims(), data=st.data())
    def _(dims, data):
        E, P = draw_rounded(data, dims, ctx, n=1), draw_rounded(data, dims, ctx, n=1)
        y, e = B.add_bound(E, 0 * E, P, 0 * P, ctx.precision)
        check_against(ctx, "input_representation", (E, P), y, e)


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
