"""The training loop, transcribed literally in float64 NumPy (spec entry ``train_loop``):
the batches each step draws, the learning rate it uses, which parameters it decays, and
the order of its operations.

Step s draws its micro-batches (:func:`training_batches`); for each, the forward pass,
the mean cross-entropy and its gradient (``gpt_backward``); averages losses and
gradients; clips the global norm (``clip_grad_norm``, when the norm is positive); takes
the step's learning rate (:func:`scheduled_lr`); one ``adamw_step`` (t = s + 1) per
parameter, decaying matrices only (:func:`decays`). :func:`train_step` is one step with
everything it computed (the conformance check replays it at a backend's own state and
derives its budgets from it); :func:`train_loop` iterates it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from gptspec.reference.gradients import gpt_backward
from gptspec.reference.optimizer import adamw_step, clip_grad_norm, lr_schedule
from gptspec.spec.config import GPTConfig

Array = np.ndarray

__all__ = ["train_loop"]


@dataclass(frozen=True)
class TrainLoopSettings:
    """The settings the loop reads. The names are those of the fast trainer's
    ``TrainSettings``, so one maps onto the other field by field."""

    max_steps: int
    batch_size: int  # sequences per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 1e-3  # η_max
    min_lr: float = 1e-4  # η_min
    warmup_steps: int = 100
    decay_steps: int = 0  # the cosine's horizon S; 0: max_steps
    beta1: float = 0.9
    beta2: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.1  # λ, on matrices only
    grad_clip: float = 1.0  # c; 0: no clipping
    seed: int = 1337

    def __post_init__(self) -> None:
        for name in ("max_steps", "batch_size", "grad_accum"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise ValueError(f"setting {name!r} must be a positive integer, got {value!r}")
        for name in ("warmup_steps", "decay_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"setting {name!r} must not be negative")
        if not 0 <= self.min_lr <= self.lr or self.lr <= 0:
            raise ValueError(f"need 0 < lr and 0 ≤ min_lr ≤ lr, got lr={self.lr}, "
                             f"min_lr={self.min_lr}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1 and self.eps > 0):
            raise ValueError(f"need 0 ≤ β₁, β₂ < 1 and ε > 0, got β₁={self.beta1}, "
                             f"β₂={self.beta2}, ε={self.eps}")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError("weight_decay and grad_clip must not be negative")

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


# --- the rules the loop is made of -----------------------------------------------------------


def batch_generator(seed: int, rank: int, step: int) -> np.random.Generator:
    """The generator that draws the batches of ``step`` (0-based) on process ``rank``:
    NumPy's PCG64 seeded with the sequence [seed, rank, step]. Keyed by all three, it needs
    no saved state, so a resumed run draws the batches the unbroken run would have."""
    return np.random.default_rng([seed, rank, step])


def training_batches(tokens, step: int, settings: TrainLoopSettings, block_size: int,
                     rank: int = 0) -> list[tuple[Array, Array]]:
    """The ``grad_accum`` micro-batches of ``step``, in order, from one generator
    (:func:`batch_generator`): each draws ``batch_size`` offsets o uniformly from
    [0, len(tokens) − T) (``Generator.integers``); a sequence is tokens[o : o + T] and its
    targets tokens[o + 1 : o + T + 1], T = ``block_size``."""
    tokens = np.asarray(tokens)
    T = block_size
    if len(tokens) < T + 1:
        raise ValueError(f"{len(tokens)} tokens cannot hold a sequence of {T} and its targets")
    rng = batch_generator(settings.seed, rank, step)
    batches = []
    for _ in range(settings.grad_accum):
        starts = rng.integers(0, len(tokens) - T, size=settings.batch_size)
        windows = np.stack([tokens[s: s + T + 1].astype(np.int64) for s in starts])
        batches.append((windows[:, :-1], windows[:, 1:]))
    return batches


def scheduled_lr(step: int, settings: TrainLoopSettings) -> float:
    """η of ``step``: ``lr_schedule`` with the horizon S = decay_steps (max_steps when 0),
    the warm-up cut to W = min(warmup_steps, S) and the horizon kept past it,
    max(S, W + 1) (so the cosine never divides by zero)."""
    horizon = settings.decay_steps or settings.max_steps
    return lr_schedule(step, settings.lr, settings.min_lr, min(settings.warmup_steps, horizon),
                       max(horizon, settings.warmup_steps + 1))


def decays(shape: tuple[int, ...]) -> bool:
    """Whether a parameter of this shape is weight-decayed: the matrices (the embeddings
    and every linear map's weight) are, vectors (biases, LayerNorm gains and shifts) not."""
    return len(shape) >= 2


# --- one step, and the loop ----------------------------------------------------------------------


@dataclass
class StepTrace:
    """Everything one step computed, by parameter name where it is per parameter."""

    loss: float  # the mean over micro-batches of each micro-batch's mean cross-entropy
    micro_losses: list[float]
    micro_grads: list[dict[str, Array]]  # each micro-batch's gradient of its own mean loss
    grads: dict[str, Array]  # their mean
    norm: float  # ‖grads‖ before clipping
    clip_scale: float  # min(1, c / (‖grads‖ + 10⁻⁶)); 1 without clipping
    clipped: dict[str, Array]  # what AdamW is fed
    lr: float
    m: dict[str, Array]
    v: dict[str, Array]
    params: dict[str, Array]  # after the step


def train_step(params: dict, moments: tuple[dict, dict] | None, step: int,
               batches: list[tuple[Array, Array]], config: GPTConfig,
               settings: TrainLoopSettings) -> StepTrace:
    """Step ``step`` (0-based) from ``params`` and AdamW's moments (None before the first
    step) on these micro-batches."""
    micro = [gpt_backward(x, y, params, config) for x, y in batches]
    k = len(micro)
    grads = {name: sum(g[name] for _, g in micro) / k for name in params}
    if settings.grad_clip > 0:
        clipped, norm = clip_grad_norm(grads, settings.grad_clip)
        scale = min(1.0, settings.grad_clip / (norm + 1e-6))
    else:
        clipped, norm, scale = grads, float(np.sqrt(sum(np.sum(g * g) for g in grads.values()))), 1.0
    lr = scheduled_lr(step, settings)
    m0, v0 = moments if moments is not None else ({}, {})
    new, m, v = {}, {}, {}
    for name, theta in params.items():
        theta = np.asarray(theta, dtype=np.float64)
        decay = settings.weight_decay if decays(theta.shape) else 0.0
        new[name], m[name], v[name] = adamw_step(
            theta, clipped[name], m0.get(name, np.zeros_like(theta)),
            v0.get(name, np.zeros_like(theta)), step + 1, lr, settings.beta1, settings.beta2,
            settings.eps, decay)
    return StepTrace(float(np.mean([loss for loss, _ in micro])), [loss for loss, _ in micro],
                     [g for _, g in micro], grads, norm, scale, clipped, lr, m, v, new)


def train_loop(tokens, params: dict, config: GPTConfig, settings: TrainLoopSettings
               ) -> tuple[list[float], list[dict[str, float]], list[dict[str, Array]]]:
    """``settings.max_steps`` steps of the loop from ``params`` on the token stream
    ``tokens`` (sequences of T = n_ctx tokens). Returns, step by step, the loss, the
    learning rate each parameter was stepped with (by name), and the parameters after the
    step (by name; the last are the final parameters)."""
    state = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    moments = None
    losses, lrs, trajectory = [], [], []
    for step in range(settings.max_steps):
        batches = training_batches(tokens, step, settings, config.n_ctx)
        trace = train_step(state, moments, step, batches, config, settings)
        state, moments = trace.params, (trace.m, trace.v)
        losses.append(trace.loss)
        lrs.append({name: trace.lr for name in state})
        trajectory.append(state)
    return losses, lrs, trajectory
