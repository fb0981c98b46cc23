"""Error scales of the backward pass, stage by stage: ``gpt_backward_bound`` mirrors the
reference's ``gpt_backward``, one ``*_bound`` per backward function, by the rules of
:mod:`gptspec.conformance.budgets`. Each takes the upstream gradient and the forward
inputs with their error scales and returns every gradient with its error scale: the
upstream error carried through the backward equation, plus the forward error of the
activations it multiplies by (x in ∂L/∂W = xᵀ ∂L/∂y, x̂ in LayerNorm's, the attention
weights in the softmax's). Why not one scale for the whole model: a LayerNorm's backward
divides by s = √(σ² + ε), so errors reaching it are amplified by |γ|/s and compound
through the layers below, while the exact gradient may cancel to nothing (over two
features x̂ = ±1 and ∂L/∂x = 0), so no gradient's size measures the error.
"""

from __future__ import annotations

import math

import numpy as np

import gptspec.reference as ref
from gptspec.conformance import budgets as B
from gptspec.conformance.budgets import LAMBDA, Precision, _q
from gptspec.reference.block import block_parameters
from gptspec.spec.config import GPTConfig
from gptspec.spec.parameters import parameter_schema

Array = np.ndarray
Bounded = tuple[Array, Array]  # a value and its error scale


def _rows(x) -> Array:
    x = np.asarray(x, dtype=np.float64)
    return x.reshape(-1, x.shape[-1])


def _sum_rows(t, et, p: Precision) -> Bounded:
    """Σ over every row (a parameter shared by all rows): the terms' errors in quadrature,
    the sum's rounding √N·u_acc·Σ|terms|, the stored result's."""
    R, eR = _rows(t), _rows(et)
    s = R.sum(axis=0)
    return s, _q(B.root_sum_square(eR, axis=0),
                 p.sum_scale(R.shape[0]) * np.abs(R).sum(axis=0), p.store(s),
                 _floor_drift(np.ones_like(R), R, eR, p))


def _floor_drift(weights, t, et, p: Precision) -> Array:
    """Σ_rows |w|·[t below TINY, rounded]·floor/2 over λ (Precision.floor_drift): the
    coherent error of a sum over rows of terms t whose roundings on the subnormal grid
    may all share a sign, each weighted by what multiplies it (1 for a plain sum)."""
    if p.tiny <= B.FLOOR_WORTH_A_TERM:
        return np.zeros(np.shape(t)[-1])
    return np.sum(np.abs(_rows(weights)) * p.subnormal(_rows(t), _rows(et)), axis=0) * p.floor_drift


def _product(x, ex, y, ey, p: Precision) -> Bounded:
    """x ⊙ y: each factor's error times the other factor, and one rounding."""
    z = np.asarray(x) * np.asarray(y)
    return z, _q(np.abs(y) * ex, np.abs(x) * ey, ex * ey, p.store(z))


def _zero(x) -> Array:
    return np.zeros(np.shape(x))


# --- linear maps and embeddings ------------------------------------------------------------


def linear_backward_bound(dY, edY, x, ex, W, p: Precision) -> tuple[Bounded, Bounded, Bounded]:
    """∂x = ∂y Wᵀ, ∂W = Σ_rows xᵀ ∂y, ∂b = Σ_rows ∂y: products with errors in ∂y (and in
    x, for ∂W); W is a parameter, exact in the dtype."""
    WT = np.asarray(W, dtype=np.float64).T
    dx = B.matmul_bound(dY, edY, WT, _zero(WT), p)
    dW = B.matmul_bound(_rows(x).T, _rows(ex).T, _rows(dY), _rows(edY), p)
    return dx, dW, _sum_rows(dY, edY, p)


def token_embedding_backward_bound(dE, edE, tokens, vocab_size: int, p: Precision) -> Bounded:
    """Row v of ∂W_E sums the c_v positions holding token v: their errors in quadrature,
    the sum's rounding √c_v·u_acc·Σ|terms|, the stored result's."""
    idx = np.asarray(tokens).reshape(-1)
    R, eR = _rows(dE), _rows(edE)
    d = R.shape[-1]
    value, squares, sizes = np.zeros((vocab_size, d)), np.zeros((vocab_size, d)), np.zeros((vocab_size, d))
    np.add.at(value, idx, R)
    top = np.zeros((vocab_size, d))  # each row's largest error: squared as they are, errors
    np.maximum.at(top, idx, np.abs(eR))  # below ~1e-154 underflow (see B.root_sum_square)
    top = np.where(top > 0, top, 1.0)
    np.add.at(squares, idx, np.square(eR / top[idx]))
    np.add.at(sizes, idx, np.abs(R))
    counts = np.bincount(idx, minlength=vocab_size)[:, None]
    drift = np.zeros((vocab_size, d))
    if p.tiny > B.FLOOR_WORTH_A_TERM:
        np.add.at(drift, idx, p.subnormal(R, eR) * p.floor_drift)
    return value, _q(np.sqrt(squares) * top, np.sqrt(counts) * p.u_acc * sizes, p.store(value),
                     drift)


def positional_embedding_backward_bound(dP, edP, n_ctx: int, p: Precision) -> Bounded:
    """Row t < T sums position t over the batch; the unused rows are exactly 0."""
    T, d = np.shape(dP)[-2], np.shape(dP)[-1]
    value, error = np.zeros((n_ctx, d)), np.zeros((n_ctx, d))
    terms = np.asarray(dP, dtype=np.float64).reshape(-1, T, d)
    errors = np.asarray(edP, dtype=np.float64).reshape(-1, T, d)
    value[:T] = terms.sum(axis=0)
    drift = (np.sum(p.subnormal(terms, errors), axis=0) * p.floor_drift
             if p.tiny > B.FLOOR_WORTH_A_TERM else 0.0)
    error[:T] = _q(B.root_sum_square(errors, axis=0),
                   p.sum_scale(terms.shape[0]) * np.abs(terms).sum(axis=0), p.store(value[:T]),
                   drift)
    return value, error


# --- LayerNorm, softmax, attention ------------------------------------------------------------


def layer_norm_backward_bound(dY, edY, x, ex, gamma, eps: float,
                              p: Precision) -> tuple[Bounded, Bounded, Bounded]:
    """∂x = (g − mean g − x̂·mean(g x̂))/s, g = ∂y ⊙ γ: g's error (∂y's times |γ|), the two
    means' (√n·u_acc), x̂'s forward error times mean(g x̂) and g, each divided by s, and
    s's relative error times |∂x|. The roundings of the subtraction are of the terms'
    size, not of ∂x's: it may cancel to nothing and its error is still u·|g|/s.
    ∂γ = Σ_rows ∂y ⊙ x̂ (∂y's and x̂'s errors), ∂β = Σ_rows ∂y."""
    dY, edY = np.asarray(dY, dtype=np.float64), np.asarray(edY, dtype=np.float64)
    gamma = np.asarray(gamma, dtype=np.float64)
    xhat, e_xhat, s, rel_s = B.layer_norm_parts(x, ex, eps, p)
    n = xhat.shape[-1]
    rms = B.root_mean_square
    mean = lambda a: np.mean(a, axis=-1, keepdims=True)
    g = dY * gamma
    eg = _q(edY * np.abs(gamma), p.u_acc * np.abs(g))
    m1 = mean(g)
    e_m1 = _q(rms(eg) / math.sqrt(n), p.sum_scale(n) * mean(np.abs(g)))
    t = g * xhat
    e_t = _q(eg * np.abs(xhat), np.abs(g) * e_xhat, p.u_acc * np.abs(t))
    m2 = mean(t)
    e_m2 = _q(rms(e_t) / math.sqrt(n), p.sum_scale(n) * mean(np.abs(t)))
    e_num = _q(eg, e_m1, e_xhat * np.abs(m2), np.abs(xhat) * e_m2,
               2 * p.u_acc * (np.abs(g) + np.abs(m1) + np.abs(xhat * m2)))
    dx = (g - m1 - xhat * m2) / s
    e_dx = _q(e_num / s, np.abs(dx) * rel_s, p.u_acc * np.abs(dx), p.store(dx))
    dgamma, e_dgamma = _sum_rows(*_product(dY, edY, xhat, e_xhat, p), p)
    e_dgamma = _q(e_dgamma, _floor_drift(xhat, dY, edY, p))  # ∂y's grid, weighted by x̂
    return (dx, e_dx), (dgamma, e_dgamma), _sum_rows(dY, edY, p)


def softmax_backward_bound(dA, edA, A, eA, p: Precision) -> Bounded:
    """∂z = a ⊙ (∂a − c), c = Σ_j a_j ∂a_j: c's error (both factors' errors and the
    row's sum), the difference's, and a's forward error times |∂a − c|."""
    dA, A = np.asarray(dA, dtype=np.float64), np.asarray(A, dtype=np.float64)
    n = A.shape[-1]
    terms, e_terms = _product(dA, edA, A, eA, p)
    c = terms.sum(axis=-1, keepdims=True)
    e_c = _q(B.root_sum_square(e_terms, axis=-1, keepdims=True),
             p.sum_scale(n) * np.abs(terms).sum(axis=-1, keepdims=True))
    diff = dA - c
    e_diff = _q(edA, e_c, p.u_acc * (np.abs(dA) + np.abs(c)))
    return _product(A, eA, diff, e_diff, p)


def scaled_dot_product_attention_backward_bound(dO, edO, Q, eQ, K, eK, V, eV, M, p: Precision
                                                ) -> tuple[Bounded, Bounded, Bounded]:
    """∂V = Aᵀ ∂O, ∂A = ∂O Vᵀ, ∂S by softmax_backward_bound, ∂Q = ∂S K/√d_k,
    ∂K = ∂Sᵀ Q/√d_k; A with its forward error (budgets.attention_bound)."""
    A, eA, _, _ = B.attention_bound(Q, eQ, K, eK, V, eV, M, p)
    T = lambda a: np.swapaxes(a, -1, -2)
    dV = B.matmul_bound(T(A), T(eA), dO, edO, p)
    dA, edA = B.matmul_bound(dO, edO, T(V), T(eV), p)
    dS, edS = softmax_backward_bound(dA, edA, A, eA, p)
    root = math.sqrt(np.shape(Q)[-1])

    def scaled(bounded: Bounded) -> Bounded:
        value, error = bounded
        return value / root, _q(error, p.store(value)) / root

    return scaled(B.matmul_bound(dS, edS, K, eK, p)), scaled(B.matmul_bound(T(dS), T(edS), Q, eQ, p)), dV


def _over_queries(X, Y) -> Array:
    """√(Σ_{n,t} X_nhti² Y_nhtj²) for each head h: (h, i, j), each head's columns scaled
    before squaring (B._quadrature_product)."""
    X, Y = (np.moveaxis(a.reshape(-1, *a.shape[-3:]), 0, 1) for a in (X, Y))  # (h, n, t, ·)
    X, Y = (a.reshape(a.shape[0], -1, a.shape[-1]) for a in (X, Y))  # (h, n·t, ·)
    return B._quadrature_product(np.swapaxes(X, -1, -2), Y)


def multi_head_attention_backward_bound(dY, edY, H, eH, W_qkv, b_qkv, W_O, b_O, n_heads: int,
                                        p: Precision) -> tuple[Bounded, dict]:
    """The forward pass again with its error scales, then the linear, attention and linear
    backward bounds in reverse order. Returns (∂H, {"w_qkv", "b_qkv", "w_o", "b_o"})."""
    QKV, eQKV = B.linear_bound(H, eH, W_qkv, b_qkv, p)
    d = QKV.shape[-1] // 3
    heads = [(ref.split_heads(QKV[..., i * d:(i + 1) * d], n_heads),
              ref.split_heads(eQKV[..., i * d:(i + 1) * d], n_heads)) for i in range(3)]
    (Q, eQ), (K, eK), (V, eV) = heads
    M = ref.causal_mask(np.shape(H)[-2])
    A, _, O, eO = B.attention_bound(Q, eQ, K, eK, V, eV, M, p)
    (dC, edC), w_o, b_o = linear_backward_bound(dY, edY, ref.merge_heads(O), ref.merge_heads(eO),
                                                W_O, p)
    dC_h, edC_h = ref.split_heads(dC, n_heads), ref.split_heads(edC, n_heads)
    grads = scaled_dot_product_attention_backward_bound(dC_h, edC_h, Q, eQ, K, eK, V, eV, M, p)
    dQKV = np.concatenate([ref.merge_heads(g) for g, _ in grads], axis=-1)
    edQKV = np.concatenate([ref.merge_heads(e) for _, e in grads], axis=-1)
    dH, (w_qkv, e_w_qkv), (b_qkv, e_b_qkv) = linear_backward_bound(dQKV, edQKV, H, eH, W_qkv, p)
    # ∂V = Aᵀ ∂O sends one query's error in ∂O to every key it attends to, with one sign:
    # the rows of ∂V are not independent, and a sum over them is not their quadrature.
    # ∂b_V = Σ_t ∂V_t is exactly Σ_s ∂O_s (a row of A sums to 1) and ∂W_V = Σ_t H_tᵀ ∂V_t
    # is Σ_s (A H)_sᵀ ∂O_s, so ∂O's errors reach them summed over the queries; the
    # quadrature over keys undercounts that by about √(Σ_t A_st²), 1/√T for a diffuse row
    # (134% of the budget on b_V in bfloat16, at 2 × 1024 tokens and two heads of 64).
    # (quadratures scaled before squaring: see B.root_sum_square)
    edC_h = np.asarray(edC_h, dtype=np.float64)
    coherent_b = B.root_sum_square(edC_h, axis=tuple(range(edC_h.ndim - 3)) + (-2,)).reshape(-1)
    AH = A @ np.asarray(H, dtype=np.float64)[..., None, :, :]
    coherent_W = np.moveaxis(_over_queries(AH, edC_h), 0, 1)  # (i, h, j)
    v_part = slice(2 * d, 3 * d)
    e_w_qkv, e_b_qkv = e_w_qkv.copy(), e_b_qkv.copy()
    e_w_qkv[:, v_part] = _q(e_w_qkv[:, v_part], coherent_W.reshape(coherent_W.shape[0], -1))
    e_b_qkv[v_part] = _q(e_b_qkv[v_part], coherent_b)
    # The same in the forward direction: O_s = Σ_t A_st V_t gives V_t's error to every
    # query that attends to key t, so O's rows' errors are not independent either.
    # ∂W_O = Σ_s O_sᵀ ∂Y_s receives V's errors as Σ_t δV_tᵀ (Aᵀ ∂Y)_t, independent over
    # the keys t; the quadrature over queries undercounts it as above (107% of the budget
    # on W_O in bfloat16, at 2 × 1024 tokens and two heads of 64).
    dY_h = np.asarray(dY, dtype=np.float64)[..., None, :, :]
    AtdY = np.swapaxes(A, -1, -2) @ dY_h  # (…, h, T, d): Σ_s A_st ∂Y_s for each key t
    coherent_O = _over_queries(np.asarray(eV, dtype=np.float64), AtdY)  # (h, i, j)
    w_o = (w_o[0], _q(w_o[1], coherent_O.reshape(-1, coherent_O.shape[-1])))
    return dH, {"w_qkv": (w_qkv, e_w_qkv), "b_qkv": (b_qkv, e_b_qkv), "w_o": w_o, "b_o": b_o}


# --- activations and feed-forward ---------------------------------------------------------------


def activation_backward_bound(name: str, dY, edY, x, ex, p: Precision) -> Bounded:
    """∂x = ∂y ⊙ σ'(x): ∂y's error times |σ'|, x's error times |σ''| ≤ 1 (all three
    activations), the derivative's own roundings (ROUNDINGS, of the size of its terms,
    at most 1 + |x|). ReLU: where x lies within λ·(its error) of 0 the backend's mask may
    differ, and ∂x be off by all of the backend's ∂y, up to |∂y| + λ·(its error). That
    error is a scale of its own, |∂y| + (its error), not |∂y|/λ: a budget of exactly
    |∂y| leaves no room for what comes after, where one flip's error reaches every
    element of ∂y Wᵀ with the same sign pattern (a coherent sum, which the quadrature
    of the later stages may undercount: 135% of such a budget was seen in bfloat16 at
    d_model 8). With the flip's scale the same λ covers it as it covers a rounding."""
    dY, x = np.asarray(dY, dtype=np.float64), np.asarray(x, dtype=np.float64)
    dx = getattr(ref, f"{name}_backward")(dY, x)
    slope = np.abs(getattr(ref, f"{name}_backward")(np.ones_like(x), x))
    if name == "relu":
        flips = (np.abs(x) <= LAMBDA * ex) & (dY != 0)
        return dx, _q(edY * slope, np.where(flips, np.abs(dY) + edY, 0.0), p.store(dx))
    curvature = np.abs(dY) * ex * (1 + LAMBDA * ex)
    local = B.ROUNDINGS[name] * p.u_acc * np.abs(dY) * (1 + np.abs(x))
    return dx, _q(edY * slope, curvature, local, p.store(dx))


def ffn_backward_bound(variant: str, dY, edY, x, ex, W_1, b_1, W_2, b_2,
                       p: Precision) -> tuple[Bounded, dict]:
    """Any FFN variant: the forward pass with its error scales, then backwards. Returns
    (∂x, {"w_1", "b_1", "w_2", "b_2"})."""
    if variant == "guide_product":  # y = ReLU(a) ⊙ ReLU(c)
        a, ea = B.linear_bound(x, ex, W_1, b_1, p)
        c, ec = B.linear_bound(x, ex, W_2, b_2, p)
        ra, era = B.activation_bound("relu", a, ea, p)
        rc, erc = B.activation_bound("relu", c, ec, p)
        da = activation_backward_bound("relu", *_product(dY, edY, rc, erc, p), a, ea, p)
        dc = activation_backward_bound("relu", *_product(dY, edY, ra, era, p), c, ec, p)
        dx_1, w_1, b_1g = linear_backward_bound(*da, x, ex, W_1, p)
        dx_2, w_2, b_2g = linear_backward_bound(*dc, x, ex, W_2, p)
        dx = B.add_bound(*dx_1, *dx_2, p)
        return dx, {"w_1": w_1, "b_1": b_1g, "w_2": w_2, "b_2": b_2g}
    act = "relu" if variant == "relu" else variant
    pre, epre = B.linear_bound(x, ex, W_1, b_1, p)
    h, eh = B.activation_bound(act, pre, epre, p)
    dh, w_2, b_2g = linear_backward_bound(dY, edY, h, eh, W_2, p)
    dpre = activation_backward_bound(act, *dh, pre, epre, p)
    dx, w_1, b_1g = linear_backward_bound(*dpre, x, ex, W_1, p)
    return dx, {"w_1": w_1, "b_1": b_1g, "w_2": w_2, "b_2": b_2g}


# --- blocks and the whole model ---------------------------------------------------------------------


class _Block:
    """One block's forward and backward bounds over its parameters (without the prefix);
    ``grads`` collects the parameter gradients' (value, error scale) by schema name."""

    def __init__(self, bp: dict, config: GPTConfig, p: Precision) -> None:
        self.bp, self.config, self.p = bp, config, p
        self.grads: dict[str, Bounded] = {}

    def ln(self, X, eX, which: str) -> Bounded:
        return B.layer_norm_bound(X, eX, self.bp[f"{which}.weight"], self.bp[f"{which}.bias"],
                                  self.config.ln_eps, self.p)

    def attn(self, X, eX) -> Bounded:
        bp = self.bp
        return B.multi_head_attention_bound(X, eX, bp["attn.w_qkv"], bp.get("attn.b_qkv"),
                                            bp["attn.w_o"], bp.get("attn.b_o"),
                                            self.config.n_heads, self.p)

    def ffn(self, X, eX) -> Bounded:
        bp = self.bp
        return B.ffn_bound(self.config.ffn, X, eX, bp["ffn.w_1"], bp.get("ffn.b_1"),
                           bp["ffn.w_2"], bp.get("ffn.b_2"), self.p)

    def _keep(self, prefix: str, grads: dict) -> None:
        for k, v in grads.items():
            if f"{prefix}.{k}" in self.bp:
                self.grads[f"{prefix}.{k}"] = v

    def ln_backward(self, dY: Bounded, X, eX, which: str) -> Bounded:
        dx, dgamma, dbeta = layer_norm_backward_bound(*dY, X, eX, self.bp[f"{which}.weight"],
                                                      self.config.ln_eps, self.p)
        self.grads[f"{which}.weight"], self.grads[f"{which}.bias"] = dgamma, dbeta
        return dx

    def attn_backward(self, dY: Bounded, X, eX) -> Bounded:
        bp = self.bp
        dx, grads = multi_head_attention_backward_bound(
            *dY, X, eX, bp["attn.w_qkv"], bp.get("attn.b_qkv"), bp["attn.w_o"],
            bp.get("attn.b_o"), self.config.n_heads, self.p)
        self._keep("attn", grads)
        return dx

    def ffn_backward(self, dY: Bounded, X, eX) -> Bounded:
        bp = self.bp
        dx, grads = ffn_backward_bound(self.config.ffn, *dY, X, eX, bp["ffn.w_1"],
                                       bp.get("ffn.b_1"), bp["ffn.w_2"], bp.get("ffn.b_2"),
                                       self.p)
        self._keep("ffn", grads)
        return dx

    def backward(self, dY: Bounded, H, eH) -> Bounded:
        """The reference's block_{pre_ln, post_ln, guide}_backward, with error scales."""
        p, add = self.p, B.add_bound
        if self.config.norm == "pre":
            X1, eX1 = self.ln(H, eH, "ln_1")
            H1, eH1 = add(H, eH, *self.attn(X1, eX1), p)
            X2, eX2 = self.ln(H1, eH1, "ln_2")
            dX2 = self.ffn_backward(dY, X2, eX2)
            dH1 = add(*dY, *self.ln_backward(dX2, H1, eH1, "ln_2"), p)
            dX1 = self.attn_backward(dH1, X1, eX1)
            return add(*dH1, *self.ln_backward(dX1, H, eH, "ln_1"), p)
        if self.config.norm == "post":
            S1, eS1 = add(H, eH, *self.attn(H, eH), p)
            H1, eH1 = self.ln(S1, eS1, "ln_1")
            S2, eS2 = add(H1, eH1, *self.ffn(H1, eH1), p)
            dS2 = self.ln_backward(dY, S2, eS2, "ln_2")
            dH1 = add(*dS2, *self.ffn_backward(dS2, H1, eH1), p)
            dS1 = self.ln_backward(dH1, S1, eS1, "ln_1")
            return add(*dS1, *self.attn_backward(dS1, H, eH), p)
        A, eA = self.attn(H, eH)
        S, eS = add(*self.ffn(A, eA), H, eH, p)
        dS = self.ln_backward(dY, S, eS, "ln_1")
        dA = self.ffn_backward(dS, A, eA)
        return add(*dS, *self.attn_backward(dA, H, eH), p)


def gpt_backward_bound(tokens, targets, params: dict, config: GPTConfig,
                       p: Precision) -> dict[str, Bounded]:
    """Every parameter's gradient of the mean cross-entropy (the reference's
    ``gpt_backward``'s values) with its error scale, by schema name.

    ∂L/∂z = (softmax(z) − onehot(y))/N inherits the logits' forward error through
    softmax_bound; then every backward equation in reverse order, as gpt_backward."""
    tokens, targets = np.asarray(tokens), np.asarray(targets)
    T = tokens.shape[-1]
    E = ref.token_embedding(tokens, params["wte"])
    H, eH = E, _zero(E)  # a row copy: exact
    if config.positional_embedding:
        P = np.broadcast_to(ref.positional_embedding(T, params["wpe"]), E.shape)
        H, eH = B.add_bound(E, _zero(E), P, _zero(E), p)
    inputs = []
    for layer in range(config.n_layers):
        inputs.append((H, eH))
        H, eH = B.block_bound(H, eH, block_parameters(params, layer), config, p)
    H_last, eH_last = H, eH
    if config.final_norm:
        H, eH = B.layer_norm_bound(H, eH, params["ln_f.weight"], params["ln_f.bias"],
                                   config.ln_eps, p)
    W_U = np.asarray(params["wte"]).T if config.tied_embeddings else params["w_u"]
    Z, eZ = B.linear_bound(H, eH, W_U, None if config.tied_embeddings else params.get("b_u"), p)

    probs, e_probs = B.softmax_bound(Z, eZ, p)
    N = targets.size
    target = ref.one_hot(targets, config.vocab_size)
    dZ = (probs - target) / N
    e_dZ = _q(e_probs / N, p.u_acc * np.abs(dZ), p.store(dZ))
    grads: dict[str, Bounded] = {}
    dH, dW_U, db_U = linear_backward_bound(dZ, e_dZ, H, eH, W_U, p)
    if not config.tied_embeddings:
        grads["w_u"], grads["b_u"] = dW_U, db_U
    if config.final_norm:
        dH, grads["ln_f.weight"], grads["ln_f.bias"] = layer_norm_backward_bound(
            *dH, H_last, eH_last, params["ln_f.weight"], config.ln_eps, p)
    for layer in reversed(range(config.n_layers)):
        block = _Block(block_parameters(params, layer), config, p)
        dH = block.backward(dH, *inputs[layer])
        grads.update({f"blocks.{layer}.{k}": v for k, v in block.grads.items()})
    wte = token_embedding_backward_bound(*dH, tokens, config.vocab_size, p)
    if config.tied_embeddings:  # W_U = W_Eᵀ: the unembedding's use, transposed, is added
        wte = B.add_bound(*wte, dW_U[0].T, dW_U[1].T, p)
    grads["wte"] = wte
    if config.positional_embedding:
        grads["wpe"] = positional_embedding_backward_bound(*dH, config.n_ctx, p)
    # Targets of probability below 2u: their ∂L/∂z all round alike (_backward_values says
    # why). That rounding is the exact value's (a backend's ∂L/∂z is off it by far less
    # than the grid's spacing), so its effect is a known error, J(r), not a random one:
    # added to the scale as |J(r)|/λ, so that the budget is |J(r)| + λ × the rest.
    shared = (target > 0) & (probs < 2 * p.u)
    if shared.any():
        rounding = (B.round_to(dZ, p.dtype) - dZ) * shared
        response = _backward_values(rounding, tokens, H, H_last, [h for h, _ in inputs],
                                    params, config)
        grads = {k: (v, e + np.abs(response[k]) / LAMBDA) for k, (v, e) in grads.items()}
    return {s.name: grads[s.name] for s in parameter_schema(config)}


def _backward_values(dZ, tokens, H, H_last, inputs: list, params: dict,
                     config: GPTConfig) -> dict[str, Array]:
    """Every gradient (by schema name) that the reference's gpt_backward computes from the
    logits' gradient dZ over the reference's own forward values (H the unembedding's
    input, H_last the final LayerNorm's, ``inputs`` each block's): linear in dZ, so it is
    the first-order response of the gradients to a perturbation dZ of ∂L/∂z.

    Why gpt_backward_bound needs it: at a target whose probability p_y is below 2u,
    ∂L/∂z_y = (p_y − 1)/N lies within about a grid spacing of −1/N, so every such entry
    rounds to one of the same two or three 16-bit numbers (for N a power of two and
    p_y < u/2, all of them to −1/N exactly: an error p_y/N each, of one sign). The rows'
    errors are then not independent: a sum over rows (∂β, ∂b, ∂W) gathers c·δ from a
    token that is the target c times, where the quadrature allows √c·δ, and the sizes
    p_y/N follow the rows' contexts, which the backward pass does not average away.
    Seen in bfloat16 (gpt_backward.long_batch, seed 7: 115% of the budget on ∂β of ln_1,
    whose error −2.0·10⁻⁶ held −0.82·10⁻⁶ of this rounding's response, J(r))."""
    grads: dict[str, Array] = {}
    if config.tied_embeddings:
        dH, dW_unembed = ref.unembed_tied_backward(dZ, H, params["wte"])
    else:
        dH, grads["w_u"], grads["b_u"] = ref.unembed_untied_backward(dZ, H, params["w_u"])
    if config.final_norm:
        dH, grads["ln_f.weight"], grads["ln_f.bias"] = ref.layer_norm_backward(
            dH, H_last, params["ln_f.weight"], config.ln_eps)
    backward = {"pre": ref.block_pre_ln_backward, "post": ref.block_post_ln_backward,
                "guide": ref.block_guide_backward}[config.norm]
    for layer in reversed(range(config.n_layers)):
        dH, block_grads = backward(dH, inputs[layer], block_parameters(params, layer), config)
        grads.update({f"blocks.{layer}.{k}": v for k, v in block_grads.items()})
    dE, dP = ref.input_representation_backward(dH)
    dW_embed = ref.token_embedding_backward(dE, tokens, config.vocab_size)
    grads["wte"] = (ref.tied_embedding_accumulation(dW_embed, dW_unembed)
                    if config.tied_embeddings else dW_embed)
    if config.positional_embedding:
        grads["wpe"] = ref.positional_embedding_backward(dP, config.n_ctx)
    return grads
