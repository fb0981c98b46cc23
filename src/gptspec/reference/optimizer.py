"""The optimizer, transcribed literally in float64 NumPy: AdamW, gradient-norm clipping and
the learning-rate schedule, one function per spec entry (group "optimizer")."""

from __future__ import annotations

import math

import numpy as np

Array = np.ndarray

__all__ = ["adamw_step", "clip_grad_norm", "lr_schedule"]


def adamw_step(theta, g, m, v, t: int, lr: float, beta1: float = 0.9, beta2: float = 0.95,
               eps: float = 1e-8, weight_decay: float = 0.0) -> tuple[Array, Array, Array]:
    """One AdamW step, t = 1, 2, … (Loshchilov & Hutter 2019, Algorithm 2):
    m_t = β₁ m_{t−1} + (1 − β₁) g_t,   v_t = β₂ v_{t−1} + (1 − β₂) g_t²,
    m̂_t = m_t / (1 − β₁ᵗ),   v̂_t = v_t / (1 − β₂ᵗ),
    θ_t = θ_{t−1} − η_t (m̂_t / (√v̂_t + ε) + λ θ_{t−1}).
    The decay λ θ_{t−1} is decoupled: it never enters m or v. Returns (θ_t, m_t, v_t)."""
    if t < 1:
        raise ValueError(f"AdamW steps count from 1, got t={t}")
    theta, g, m, v = (np.asarray(a, dtype=np.float64) for a in (theta, g, m, v))
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    m_hat = m / (1.0 - beta1**t)
    v_hat = v / (1.0 - beta2**t)
    theta = theta - lr * (m_hat / (np.sqrt(v_hat) + eps) + weight_decay * theta)
    return theta, m, v


def clip_grad_norm(grads: dict, max_norm: float, eps: float = 1e-6) -> tuple[dict, float]:
    """‖g‖ = √(Σ_p Σ_i g_{p,i}²) over every parameter together; when ‖g‖ > c every gradient
    is scaled by c / (‖g‖ + ε), otherwise left alone. Returns (grads, ‖g‖ before clipping)."""
    norm = math.sqrt(sum(float(np.sum(np.asarray(g, dtype=np.float64) ** 2))
                         for g in grads.values()))
    scale = min(1.0, max_norm / (norm + eps))
    return {k: np.asarray(g, dtype=np.float64) * scale for k, g in grads.items()}, norm


def lr_schedule(step: int, max_lr: float, min_lr: float, warmup_steps: int,
                decay_steps: int) -> float:
    """η(s) for step s = 0, 1, …: linear warm-up η_max (s + 1)/W for s < W; then cosine decay
    η_min + ½ (η_max − η_min)(1 + cos(π (s − W)/(S − W))) until s = S; η_min after."""
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step >= decay_steps:
        return min_lr
    progress = (step - warmup_steps) / (decay_steps - warmup_steps)
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))
