"""Sampling and generation, transcribed literally in float64 NumPy: one function per spec entry.

Randomness comes only from an explicit ``numpy.random.Generator`` (seeded by the caller):
one uniform per drawn token. ``generate`` recomputes the full reference forward pass on
the cropped context at every step — no cache — which is the spec's definition of
generation that faster implementations are checked against.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from gptspec.reference.attention import softmax
from gptspec.reference.output import gpt_forward
from gptspec.spec.config import GPTConfig

Array = np.ndarray

__all__ = [
    "temperature_softmax",
    "greedy_token",
    "top_k_filter",
    "nucleus_filter",
    "sampling_distribution",
    "sample_token",
    "kv_cache_attention",
    "crop_context",
    "stop_condition",
    "generate",
]


def _logits(z) -> Array:
    z = np.asarray(z, dtype=np.float64)
    if z.ndim != 1:
        raise ValueError(f"expected one row of logits (V,), got shape {z.shape}")
    return z


def check_sampling_settings(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Refuse settings that define no distribution; the message names the setting."""
    finite = isinstance(temperature, (int, float)) and math.isfinite(temperature)
    if not finite or temperature < 0:
        raise ValueError(f"temperature must be a finite number ≥ 0 (0 is greedy), "
                         f"got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer))
                              or top_k <= 0):
        raise ValueError(f"top-k must be a positive integer, got {top_k!r}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top-p must lie in (0, 1], got {top_p!r}")


def temperature_softmax(z, temperature: float = 1.0) -> Array:
    """q = softmax(z / τ), τ > 0, over the last axis."""
    if not temperature > 0:
        raise ValueError(f"temperature_softmax needs τ > 0, got {temperature!r} (τ = 0 is greedy)")
    return softmax(np.asarray(z, dtype=np.float64) / temperature)


def greedy_token(z) -> int:
    """The lowest token id among the maximal logits (np.argmax returns the first maximum)."""
    return int(np.argmax(_logits(z)))


def top_k_filter(z, k: int) -> Array:
    """Keep z_i ≥ z_(k), the k-th largest logit counted with multiplicity; −∞ elsewhere.
    Row by row over the last axis."""
    z = np.asarray(z, dtype=np.float64)
    if k <= 0:
        raise ValueError(f"top-k must be a positive integer, got {k!r}")
    k = min(int(k), z.shape[-1])
    kth = np.sort(z, axis=-1)[..., ::-1][..., k - 1 : k]
    return np.where(z >= kth, z, -np.inf)


def nucleus_filter(z, p: float) -> Array:
    """Keep the shortest prefix of tokens, by descending probability (ties: ascending id),
    whose probability mass reaches p (the crossing token included); −∞ elsewhere.
    Row by row over the last axis."""
    z = np.asarray(z, dtype=np.float64)
    if not 0 < p <= 1:
        raise ValueError(f"top-p must lie in (0, 1], got {p!r}")
    if z.ndim > 1:
        return np.stack([nucleus_filter(row, p) for row in z.reshape(-1, z.shape[-1])]
                        ).reshape(z.shape)
    if p >= 1:
        return z.copy()
    probs = softmax(z)
    order = sorted(range(z.size), key=lambda i: (-probs[i], i))
    keep = np.zeros(z.size, dtype=bool)
    mass = 0.0
    for i in order:
        keep[i] = True
        mass += probs[i]
        if mass >= p:
            break
    return np.where(keep, z, -np.inf)


def sampling_distribution(z, temperature: float = 1.0, top_k: int | None = None,
                          top_p: float | None = None) -> Array:
    """q = softmax(nucleus_p(top_k(z / τ))) for τ > 0; the one-hot of greedy_token(z) for τ = 0.
    Row by row over the last axis."""
    z = np.asarray(z, dtype=np.float64)
    check_sampling_settings(temperature, top_k, top_p)
    if temperature == 0:
        q = np.zeros(z.shape)
        np.put_along_axis(q, np.argmax(z, axis=-1)[..., None], 1.0, axis=-1)
        return q
    z = z / temperature
    if top_k is not None:
        z = top_k_filter(z, top_k)
    if top_p is not None:
        z = nucleus_filter(z, top_p)
    return softmax(z)  # exp(−∞ − max) = 0: filtered tokens get no mass


def sample_token(q, rng: np.random.Generator) -> int:
    """The first token id whose cumulative mass exceeds one uniform u ∈ [0, 1) from ``rng``."""
    q = np.asarray(q, dtype=np.float64)
    u = rng.random()
    mass = 0.0
    for i, q_i in enumerate(q):
        mass += q_i
        if mass > u:
            return i
    # The float64 total can fall just short of 1 (and of u): take the last token with mass.
    return int(np.flatnonzero(q > 0)[-1])


def kv_cache_attention(q, K, V) -> Array:
    """softmax(q Kᵀ / √d_k) V for one new query over the cached keys and values of
    positions 0…t (no mask: every cached position is at or before t)."""
    q, K, V = (np.asarray(a, dtype=np.float64) for a in (q, K, V))
    scores = q @ K.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    return softmax(scores, axis=-1) @ V


def crop_context(tokens, n_ctx: int) -> list[int]:
    """The last n_ctx tokens."""
    tokens = [int(t) for t in tokens]
    return tokens[max(0, len(tokens) - n_ctx):]


def stop_condition(token: int, n: int, max_new_tokens: int, eot_token: int | None = None) -> bool:
    """Stop after the n-th new token if it is end-of-text or n reached the length."""
    return (eot_token is not None and token == eot_token) or n >= max_new_tokens


def generate(prompts, params: dict, config: GPTConfig, max_new_tokens: int, *,
             temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
             eot_token: int | None = None, rng: np.random.Generator | None = None,
             return_logits: bool = False, forward: Callable[..., Any] = gpt_forward):
    """Generate up to ``max_new_tokens`` tokens after each prompt of ``prompts`` (a list
    of token lists), recomputing the full forward pass on the cropped context at every
    step. Each prompt is generated on its own, one after the other (a batch is just its
    sequences; the uniforms of ``rng`` are drawn in that order).

    ``forward(tokens, params, config)`` maps a context (T,) to its logits (T, V): the
    reference's ``gpt_forward`` unless another model's is given (generation driven
    through an engine that returns logits and nothing else).

    Returns, per prompt, the new tokens (the end-of-text token included when it stopped
    the loop) and, with ``return_logits``, the (n, V) logits each token was drawn from."""
    check_sampling_settings(temperature, top_k, top_p)
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be ≥ 0, got {max_new_tokens}")
    if temperature > 0 and rng is None:
        raise ValueError("sampling (temperature > 0) needs an explicit seeded rng")
    tokens_out, logits_out = [], []
    for b, prompt in enumerate(prompts):
        tokens = [int(t) for t in np.asarray(prompt).reshape(-1)]
        if not tokens:
            raise ValueError(f"prompt {b} is empty: generation needs at least one token")
        new: list[int] = []
        step_logits: list[Array] = []
        for n in range(1, max_new_tokens + 1):
            context = crop_context(tokens, config.n_ctx)
            z = np.asarray(forward(np.asarray(context), params, config), dtype=np.float64)[-1]
            if temperature == 0:
                token = greedy_token(z)
            else:
                assert rng is not None  # checked above
                token = sample_token(sampling_distribution(z, temperature, top_k, top_p), rng)
            tokens.append(token)
            new.append(token)
            step_logits.append(z)
            if stop_condition(token, n, max_new_tokens, eot_token):
                break
        tokens_out.append(new)
        logits_out.append(np.array(step_logits).reshape(len(new), config.vocab_size))
    return (tokens_out, logits_out) if return_logits else tokens_out
