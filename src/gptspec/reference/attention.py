"""Attention, transcribed literally in float64 NumPy: one function per spec entry of the
"attention" group. Row vectors: a sequence is (..., T, d); leading axes are batch.
"""

from __future__ import annotations

import math

import numpy as np

from gptspec.reference.arrays import Array, f64

__all__ = [
    "linear",
    "qkv_projection",
    "split_heads",
    "merge_heads",
    "causal_mask",
    "softmax_shifted",
    "softmax",
    "attention_scores",
    "attention_weights",
    "scaled_dot_product_attention",
    "multi_head_attention",
    "multi_head_attention_head_sum",
]


def linear(x, W, b=None) -> Array:
    """y = x W + b."""
    y = f64(x) @ f64(W)
    return y if b is None else y + f64(b)


def qkv_projection(H, W_qkv, b_qkv=None) -> tuple[Array, Array, Array]:
    """Q = H W_Q + b_Q, K = H W_K + b_K, V = H W_V + b_V (Blueprint eq 2), all heads at once."""
    QKV = linear(H, W_qkv, b_qkv)
    d = QKV.shape[-1] // 3
    return QKV[..., :d], QKV[..., d : 2 * d], QKV[..., 2 * d :]


def split_heads(X, n_heads: int) -> Array:
    """(…, T, d) → (…, h, T, d_k): head i takes columns i·d_k … (i+1)·d_k − 1."""
    X = f64(X)
    *lead, T, d = X.shape
    return X.reshape(*lead, T, n_heads, d // n_heads).swapaxes(-3, -2)


def merge_heads(X) -> Array:
    """Concat(head_1, …, head_h): (…, h, T, d_k) → (…, T, h·d_k)."""
    X = f64(X)
    *lead, h, T, dk = X.shape
    return X.swapaxes(-3, -2).reshape(*lead, T, h * dk)


def causal_mask(T: int) -> Array:
    """M[i, j] = 0 if j ≤ i else −∞."""
    M = np.zeros((T, T))
    M[np.triu_indices(T, k=1)] = -np.inf
    return M


def softmax_shifted(z, c, axis: int = -1) -> Array:
    """exp(z − c) / Σ exp(z − c): equal to softmax(z) for every finite c."""
    e = np.exp(f64(z) - c)
    return e / e.sum(axis=axis, keepdims=True)


def softmax(z, axis: int = -1) -> Array:
    """softmax(z)_i = exp(z_i) / Σ_j exp(z_j), evaluated through the shift identity with
    c = max z so that no exponential overflows."""
    z = f64(z)
    c = np.max(z, axis=axis, keepdims=True)
    return softmax_shifted(z, c, axis=axis)


def attention_scores(Q, K, M) -> Array:
    """S = Q Kᵀ / √d_k + M."""
    Q, K = f64(Q), f64(K)
    return Q @ K.swapaxes(-1, -2) / math.sqrt(Q.shape[-1]) + f64(M)


def attention_weights(Q, K, M) -> Array:
    """A = softmax(S), row by row."""
    return softmax(attention_scores(Q, K, M), axis=-1)


def scaled_dot_product_attention(Q, K, V, M) -> Array:
    """Attention(Q, K, V) = softmax(Q Kᵀ / √d_k + M) V (Blueprint eq 3)."""
    return attention_weights(Q, K, M) @ f64(V)


def _causal_heads(H, W_qkv, b_qkv, n_heads: int) -> Array:
    """head_i = Attention(H W_Q⁽ⁱ⁾, H W_K⁽ⁱ⁾, H W_V⁽ⁱ⁾) with the causal mask (Blueprint eq 5),
    all heads stacked: (…, h, T, d_k)."""
    Q, K, V = qkv_projection(H, W_qkv, b_qkv)
    M = causal_mask(f64(H).shape[-2])
    return scaled_dot_product_attention(
        split_heads(Q, n_heads), split_heads(K, n_heads), split_heads(V, n_heads), M
    )


def multi_head_attention(H, W_qkv, b_qkv, W_O, b_O, n_heads: int) -> Array:
    """MultiHead(H) = Concat(head_1, …, head_h) W_O + b_O (Blueprint eqs 4–5)."""
    return linear(merge_heads(_causal_heads(H, W_qkv, b_qkv, n_heads)), W_O, b_O)


def multi_head_attention_head_sum(H, W_qkv, b_qkv, W_O, b_O, n_heads: int) -> Array:
    """Σ_i head_i W_O⁽ⁱ⁾ + b_O, with W_O⁽ⁱ⁾ the rows i·d_k … (i+1)·d_k − 1 of W_O: each
    head writes into the residual stream on its own (the Notes' view)."""
    heads = _causal_heads(H, W_qkv, b_qkv, n_heads)
    W_O = f64(W_O)
    dk = W_O.shape[0] // n_heads
    out = sum(heads[..., i, :, :] @ W_O[i * dk : (i + 1) * dk] for i in range(n_heads))
    return out if b_O is None else out + f64(b_O)
