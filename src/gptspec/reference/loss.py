"""The training objective, transcribed literally in float64 NumPy: one function per spec entry.

Row t of ``logits`` predicts ``targets[..., t]`` (for causal language modelling the
targets are the tokens shifted left by one).
"""

from __future__ import annotations

import numpy as np

from gptspec.reference.attention import softmax
from gptspec.reference.embedding import one_hot

Array = np.ndarray

__all__ = ["log_softmax", "cross_entropy_sum", "cross_entropy_mean", "cross_entropy_gradient"]


def log_softmax(z, axis: int = -1) -> Array:
    """log softmax(z)_i = z_i − log Σ_j exp(z_j), shifted by max z so nothing overflows."""
    z = np.asarray(z, dtype=np.float64)
    shifted = z - np.max(z, axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def _target_log_probs(logits, targets) -> Array:
    targets = np.asarray(targets)
    log_p = log_softmax(logits)
    if targets.shape != log_p.shape[:-1]:
        raise ValueError(f"targets of shape {targets.shape} do not match logits {log_p.shape}")
    if targets.size and (targets.min() < 0 or targets.max() >= log_p.shape[-1]):
        raise ValueError(f"targets must lie in [0, {log_p.shape[-1]})")
    return np.take_along_axis(log_p, targets[..., None], axis=-1)[..., 0]


def cross_entropy_sum(logits, targets) -> float:
    """L = − Σ_X Σ_t log P(x_t | x_<t) (Blueprint eq 10): summed over every position."""
    return float(-_target_log_probs(logits, targets).sum())


def cross_entropy_mean(logits, targets) -> float:
    """L̄ = L / N, N the number of predicted positions: the per-token loss."""
    log_p = _target_log_probs(logits, targets)
    return float(-log_p.sum() / log_p.size)


def cross_entropy_gradient(logits, targets, reduction: str = "sum") -> Array:
    """∂L/∂z_t = softmax(z_t) − onehot(y_t); divided by N for the per-token mean."""
    logits = np.asarray(logits, dtype=np.float64)
    grad = softmax(logits, axis=-1) - one_hot(targets, logits.shape[-1])
    if reduction == "mean":
        return grad / (grad.size // grad.shape[-1])
    if reduction == "sum":
        return grad
    raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
