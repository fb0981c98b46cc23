"""Optimizer and schedule backends of engines nobody here wrote, judged on those areas alone
(``capabilities``: no model, no forward): ``torch.optim.AdamW`` with its for-each and its
fused implementation, optax's ``adamw`` (JAX), ``torch.optim.lr_scheduler``'s warm-up and
cosine schedulers chained as the spec's schedule reads, and transformers' cosine schedule
with warm-up and a floor.

Each runs the engine as its users do: the parameters in the dtype judged (so in bfloat16
the engine keeps whatever state it keeps for bfloat16 parameters), the learning rate set
per step, the schedule read from the engine's optimizer after ``step()`` calls. What the
adapters add is the protocol's conversion of NumPy arrays and the mapping of the spec's
schedule parameters onto each engine's own (written out on each class).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gptspec.conformance.protocol import PROTOCOL_VERSION, NotApplicable

DTYPES = ("float64", "float32", "bfloat16", "float16")


class _Engine:
    protocol_version = PROTOCOL_VERSION
    device = "cpu"

    def __init__(self, dtype: str = "float32") -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
        self.dtype = dtype


# --- torch.optim.AdamW ---------------------------------------------------------------------


class _TorchAdamW(_Engine):
    capabilities = ("optimizer",)
    implementation = ""  # "foreach" or "fused": AdamW's keyword that selects it

    def __init__(self, dtype: str = "float32") -> None:
        super().__init__(dtype)
        import torch

        self.version = f"torch {torch.__version__} (torch.optim.AdamW, {self.implementation})"
        self._torch_dtype = getattr(torch, dtype)

    def adamw_trajectory(self, params: Mapping[str, Any], grads: Sequence[Mapping[str, Any]],
                         lrs: Sequence[float], beta1: float, beta2: float, eps: float,
                         weight_decay: float) -> list[dict[str, np.ndarray]]:
        import torch

        def tensor(a: Any) -> torch.Tensor:
            return torch.tensor(np.asarray(a, dtype=np.float64)).to(self._torch_dtype)

        held = {k: torch.nn.Parameter(tensor(v)) for k, v in params.items()}
        opt = torch.optim.AdamW(list(held.values()), lr=float(lrs[0]), betas=(beta1, beta2),
                                eps=eps, weight_decay=weight_decay,
                                **{self.implementation: True})
        out = []
        for g, lr in zip(grads, lrs, strict=True):
            for k, p in held.items():
                p.grad = tensor(g[k])
            for group in opt.param_groups:
                group["lr"] = float(lr)
            opt.step()
            out.append({k: p.detach().to(torch.float64).numpy().copy() for k, p in held.items()})
        return out


class TorchAdamWForeach(_TorchAdamW):
    """torch.optim.AdamW(foreach=True): the multi-tensor implementation."""

    name = "torch-adamw-foreach"
    implementation = "foreach"


class TorchAdamWFused(_TorchAdamW):
    """torch.optim.AdamW(fused=True): the fused kernel."""

    name = "torch-adamw-fused"
    implementation = "fused"


# --- optax.adamw ---------------------------------------------------------------------------


class OptaxAdamW(_Engine):
    """optax.adamw (through optax.inject_hyperparams, so the learning rate is set per step),
    on JAX's CPU arrays of the dtype; float64 where JAX's x64 mode is on."""

    name = "optax-adamw"
    capabilities = ("optimizer",)

    def __init__(self, dtype: str = "float32") -> None:
        super().__init__(dtype)
        import jax
        import optax

        self.version = f"optax {optax.__version__}, jax {jax.__version__}"
        if dtype == "float64" and not jax.config.read("jax_enable_x64"):
            raise ValueError("float64 needs JAX's x64 mode (JAX_ENABLE_X64=1)")

    def adamw_trajectory(self, params: Mapping[str, Any], grads: Sequence[Mapping[str, Any]],
                         lrs: Sequence[float], beta1: float, beta2: float, eps: float,
                         weight_decay: float) -> list[dict[str, np.ndarray]]:
        import jax.numpy as jnp
        import optax

        def array(a: Any) -> Any:
            return jnp.asarray(np.asarray(a, dtype=np.float64)).astype(self.dtype)

        theta = {k: array(v) for k, v in params.items()}
        opt = optax.inject_hyperparams(optax.adamw)(learning_rate=float(lrs[0]), b1=beta1,
                                                    b2=beta2, eps=eps,
                                                    weight_decay=weight_decay)
        state = opt.init(theta)
        out = []
        for g, lr in zip(grads, lrs, strict=True):
            state.hyperparams["learning_rate"] = jnp.asarray(lr, dtype=jnp.float32)
            updates, state = opt.update({k: array(g[k]) for k in theta}, state, theta)
            theta = optax.apply_updates(theta, updates)
            out.append({k: np.asarray(v.astype(jnp.float32), dtype=np.float64)
                        for k, v in theta.items()})
        return out

    def clip_grad_norm(self, grads: Mapping[str, Any], max_norm: float
                       ) -> tuple[dict[str, np.ndarray], float]:
        """optax.clip_by_global_norm on gradients of the dtype; the norm is
        optax.global_norm's."""
        import jax.numpy as jnp
        import optax

        g = {k: jnp.asarray(np.asarray(v, dtype=np.float64)).astype(self.dtype)
             for k, v in grads.items()}
        clip = optax.clip_by_global_norm(max_norm)
        clipped, _ = clip.update(g, clip.init(g))
        norm = optax.tree.norm(g)
        return ({k: np.asarray(v.astype(jnp.float32), dtype=np.float64)
                 for k, v in clipped.items()}, float(norm))


# --- schedules -----------------------------------------------------------------------------


class TorchLRScheduler(_Engine):
    """torch.optim.lr_scheduler's own schedulers chained as the spec's schedule reads:
    LinearLR from η_max/W to η_max over the W warm-up steps, CosineAnnealingLR from η_max
    to η_min over the S − W decay steps, then ConstantLR holding η_min, joined by
    SequentialLR at steps W and S (a stage of no steps left out). The rate of step s is
    the optimizer's ``lr`` after s calls of ``scheduler.step()``."""

    name = "torch-lr-scheduler"
    capabilities = ("schedule",)

    def __init__(self, dtype: str = "float32") -> None:
        super().__init__(dtype)
        import torch

        self.version = f"torch {torch.__version__} (torch.optim.lr_scheduler)"

    def lr_schedule(self, step: int, max_lr: float, min_lr: float, warmup_steps: int,
                    decay_steps: int) -> float:
        from torch.optim import lr_scheduler as sched

        def chained(opt: Any) -> Any:
            stages: list[sched.LRScheduler] = []
            milestones: list[int] = []
            if warmup_steps > 0:
                stages.append(sched.LinearLR(opt, start_factor=1 / warmup_steps,
                                             end_factor=1.0,
                                             total_iters=max(warmup_steps - 1, 0)))
            if decay_steps > warmup_steps:
                if stages:
                    milestones.append(warmup_steps)
                stages.append(sched.CosineAnnealingLR(opt, T_max=decay_steps - warmup_steps,
                                                      eta_min=min_lr))
            if stages:
                milestones.append(max(decay_steps, warmup_steps))
            stages.append(sched.ConstantLR(opt, factor=min_lr / max_lr, total_iters=10**9))
            return stages[0] if len(stages) == 1 else sched.SequentialLR(opt, stages,
                                                                         milestones)

        return _rate_after(chained, max_lr, step)


class TransformersSchedule(_Engine):
    """transformers' ``get_cosine_with_min_lr_schedule_with_warmup`` (W warm-up steps, the
    cosine over S steps in all, the floor η_min), read as transformers' Trainer reads it:
    the optimizer's ``lr`` after s calls of ``scheduler.step()``."""

    name = "hf-cosine-schedule"
    capabilities = ("schedule",)

    def __init__(self, dtype: str = "float32") -> None:
        super().__init__(dtype)
        import transformers

        self.version = f"transformers {transformers.__version__}"

    def lr_schedule(self, step: int, max_lr: float, min_lr: float, warmup_steps: int,
                    decay_steps: int) -> float:
        from transformers import get_cosine_with_min_lr_schedule_with_warmup

        if decay_steps < warmup_steps:
            raise NotApplicable("transformers' schedule needs the warm-up within the "
                                "training steps")
        return _rate_after(lambda opt: get_cosine_with_min_lr_schedule_with_warmup(
            opt, num_warmup_steps=warmup_steps, num_training_steps=decay_steps, min_lr=min_lr),
            max_lr, step)


def _rate_after(make_scheduler: Any, max_lr: float, step: int) -> float:
    """The learning rate a torch scheduler gives after ``step`` calls of ``step()``, read
    from a one-parameter optimizer started at ``max_lr``, as a training loop reads it."""
    import torch

    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=max_lr)
    scheduler = make_scheduler(opt)
    for _ in range(step):
        opt.step()
        scheduler.step()
    return float(opt.param_groups[0]["lr"])
