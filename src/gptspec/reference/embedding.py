"""Embedding, transcribed literally in float64 NumPy: one function per spec entry of the
"embedding" group (token ids to the first hidden states H⁽⁰⁾).
"""

from __future__ import annotations

import numpy as np

from gptspec.reference.arrays import Array, f64
from gptspec.spec.config import GPTConfig

__all__ = [
    "one_hot",
    "token_embedding_one_hot",
    "token_embedding",
    "positional_embedding",
    "input_representation",
]


def _token_ids(tokens, vocab_size: int) -> Array:
    """The ids as an integer array, refusing any outside [0, V) (NumPy would wrap a
    negative id around to the end of W_E, or give a zero one-hot row)."""
    tokens = np.asarray(tokens)
    if tokens.size and not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"token ids must be integers, got dtype {tokens.dtype}")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got "
                         f"[{tokens.min()}, {tokens.max()}]")
    return tokens


def one_hot(tokens, vocab_size: int) -> Array:
    """X[t, v] = 1 if x_t = v else 0."""
    tokens = _token_ids(tokens, vocab_size)
    return (tokens[..., None] == np.arange(vocab_size)).astype(np.float64)


def token_embedding_one_hot(X, W_E) -> Array:
    """E = X W_E: the one-hot rows select rows of W_E by a matrix product."""
    return f64(X) @ f64(W_E)


def token_embedding(tokens, W_E) -> Array:
    """e_t = W_E[x_t]: the same map as row selection."""
    W_E = f64(W_E)
    return W_E[_token_ids(tokens, W_E.shape[0])]


def positional_embedding(T: int, W_P) -> Array:
    """P = rows 0 … T−1 of W_P."""
    return f64(W_P)[:T]


def input_representation(E, P) -> Array:
    """h_t⁽⁰⁾ = e_t + p_t (Blueprint sec. 2.1)."""
    return f64(E) + f64(P)




def embed(tokens, params: dict, config: GPTConfig) -> Array:
    """H⁽⁰⁾ = W_E[x] + W_P[:T] (Blueprint sec. 2.1), or W_E[x] alone for a model without
    positional embedding (the Guide's z_i = E(x_i), sec. 2)."""
    E = token_embedding(tokens, params["wte"])
    if not config.positional_embedding:
        return E
    return input_representation(E, positional_embedding(np.shape(tokens)[-1], params["wpe"]))
