"""Sampling in JAX: the distribution a token is drawn from, from the spec's equations
(group "sampling"): q = softmax(nucleus_p(top_k(z / τ))) for τ > 0, the one-hot of the
lowest-id maximum for τ = 0. Row by row over the last axis; computed in float32 at least
(16-bit logits are widened first, exactly).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gptspec.adapters.jax.ops import accumulation_dtype

Array = jax.Array


def greedy(z: Array) -> Array:
    """The one-hot of the lowest id among the maximal logits (argmax returns the first)."""
    return jax.nn.one_hot(jnp.argmax(z, axis=-1), z.shape[-1], dtype=jnp.float32)


def top_k_filter(y: Array, k: int) -> Array:
    """Keep y_i ≥ y_(k), the k-th largest counted with multiplicity (so every tie with it
    is kept); −∞ elsewhere."""
    k = min(k, y.shape[-1])
    kth = jnp.sort(y, axis=-1)[..., y.shape[-1] - k][..., None]
    return jnp.where(y >= kth, y, -jnp.inf)


def nucleus_filter(y: Array, p: Array) -> Array:
    """Keep the shortest prefix, by descending probability and then ascending id, whose
    mass reaches p: token i is kept when the mass strictly before it is below p (so the
    token that crosses p is kept); −∞ elsewhere."""
    probs = jax.nn.softmax(y, axis=-1)
    order = jnp.argsort(-probs, axis=-1, stable=True)  # ties: the lower id first
    sorted_probs = jnp.take_along_axis(probs, order, axis=-1)
    before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
    keep_sorted = before < p
    keep = jnp.take_along_axis(keep_sorted, jnp.argsort(order, axis=-1), axis=-1)
    return jnp.where(keep, y, -jnp.inf)


def sampling_distribution(z: Array, temperature: Array, top_p: Array, *, top_k: int | None,
                          nucleus: bool) -> Array:
    """softmax(nucleus(top_k(z / τ))) in float32 at least; τ > 0 (τ = 0 is ``greedy``).
    ``top_k`` and whether a nucleus applies are static (they shape the computation); τ
    and p are traced, so new values do not recompile."""
    y = z.astype(accumulation_dtype(z.dtype)) / temperature
    if top_k is not None:
        y = top_k_filter(y, top_k)
    if nucleus:
        y = nucleus_filter(y, top_p)
    return jax.nn.softmax(y, axis=-1)  # exp(−∞ − max) = 0: filtered tokens get no mass
