"""AdamW as the trainer runs it: the spec's ``adamw_step`` on every parameter of a group
by one fused torch kernel.

The kernel is the one ``torch.optim.AdamW(fused=True)`` calls, with the same state (a
float32 step count and two moments per parameter) and arithmetic: Loshchilov & Hutter's
Algorithm 2 with the decay scaled by the learning rate, as the spec decides. It is called
directly because any ``torch.optim`` optimizer imports ``torch._dynamo`` and sympy, a
noticeable share of a short run's start-up. The interface is the part of
``torch.optim.Optimizer`` the trainer and its tools use (``param_groups``, ``state``,
``step``, ``zero_grad``, ``register_step_pre_hook``), so ``torch.amp.GradScaler`` and DDP
work with it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

Tensor = torch.Tensor
StepPreHook = Callable[["AdamW", tuple, dict], None]

# the devices with a fused AdamW kernel in torch (the trainer runs on these two only)
FUSED_DEVICES = ("cpu", "cuda")


class _HookHandle:
    def __init__(self, hooks: list[StepPreHook], hook: StepPreHook) -> None:
        self._hooks, self._hook = hooks, hook

    def remove(self) -> None:
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)


class AdamW:
    """``groups``: dicts with "params" (tensors on one device, cpu or cuda) and
    "weight_decay"; every group starts at learning rate ``lr`` (set a group's "lr" to
    change it for the next step)."""

    def __init__(self, groups: Iterable[dict[str, Any]], lr: float,
                 betas: tuple[float, float], eps: float) -> None:
        self.param_groups = [{"params": list(g["params"]), "weight_decay": g["weight_decay"],
                              "lr": lr} for g in groups]
        for group in self.param_groups:
            for p in group["params"]:
                if p.device.type not in FUSED_DEVICES:
                    raise ValueError(f"AdamW runs on {' or '.join(FUSED_DEVICES)}, not on "
                                     f"{p.device.type}")
        self.betas, self.eps = betas, eps
        self.state: dict[Tensor, dict[str, Tensor]] = {}
        self._pre_hooks: list[StepPreHook] = []

    def register_step_pre_hook(self, hook: StepPreHook) -> _HookHandle:
        """``hook(optimizer, (), {})`` before each step, as torch.optim calls it."""
        self._pre_hooks.append(hook)
        return _HookHandle(self._pre_hooks, hook)

    def set_state(self, p: Tensor, step: int, exp_avg: Tensor, exp_avg_sq: Tensor) -> None:
        """``p``'s state after ``step`` steps (a resumed run's): the kernel's step count, a
        float32 tensor on ``p``'s device, and the moments in ``p``'s dtype and device."""
        self.state[p] = {"step": torch.tensor(float(step), dtype=torch.float32, device=p.device),
                         "exp_avg": exp_avg.to(p), "exp_avg_sq": exp_avg_sq.to(p)}

    def _state_of(self, p: Tensor) -> dict[str, Tensor]:
        if p not in self.state:
            zeros = torch.zeros_like(p, memory_format=torch.preserve_format)
            self.set_state(p, 0, zeros, zeros.clone())
        return self.state[p]

    @torch.no_grad()
    def step(self) -> None:
        """One AdamW step of every parameter that has a gradient."""
        for hook in list(self._pre_hooks):
            hook(self, (), {})
        beta1, beta2 = self.betas
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [self._state_of(p) for p in params]
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, 1)
            torch._fused_adamw_(params, [p.grad for p in params],
                                [s["exp_avg"] for s in states],
                                [s["exp_avg_sq"] for s in states], [], steps,
                                lr=float(group["lr"]), beta1=beta1, beta2=beta2,
                                weight_decay=float(group["weight_decay"]), eps=self.eps,
                                amsgrad=False, maximize=False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()
