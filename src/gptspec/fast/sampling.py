"""Sampling in PyTorch: the spec's ``sampling`` group (temperature → top-k → nucleus).

``sampling_distribution`` is the distribution a token is drawn from, ``sample`` draws one
token per row of logits with a ``torch.Generator`` (a fixed seed reproduces the tokens).
Their meaning is ``gptspec.reference.sampling``'s; ``gptspec.fast.generate`` calls them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gptspec.reference.sampling import check_sampling_settings

Tensor = torch.Tensor


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: temperature 0 is greedy; top_k / top_p None is off."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        check_sampling_settings(self.temperature, self.top_k, self.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = Sampling(temperature=0.0)


def _sampling_dtype(dtype: torch.dtype) -> torch.dtype:
    # 16-bit logits are widened: the nucleus's cumulative sum needs float32 at least
    return torch.float64 if dtype == torch.float64 else torch.float32


def top_k_filter(z: Tensor, k: int) -> Tensor:
    """Keep z_i ≥ the k-th largest logit (ties with it kept); −∞ elsewhere. (…, V)."""
    k = min(int(k), z.shape[-1])
    kth = torch.topk(z, k, dim=-1).values[..., -1:]
    return z.masked_fill(z < kth, float("-inf"))


def nucleus_filter(z: Tensor, p: float) -> Tensor:
    """Keep the shortest prefix, by descending probability with equal probabilities in
    ascending token id (a stable sort), whose mass reaches p; −∞ elsewhere. (…, V)."""
    if p >= 1:
        return z
    probs = torch.softmax(z, dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    # kept iff the mass strictly before it is < p: the prefix up to the crossing token
    cum = torch.cumsum(sorted_probs, dim=-1)
    before = torch.cat([torch.zeros_like(cum[..., :1]), cum[..., :-1]], dim=-1)
    inside = before < p
    inside[..., 0] = True  # the most likely token always: a p below the dtype's smallest
    # number (1e-46 in float32) must not round to 0 and leave an empty nucleus
    keep = torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, inside)
    return z.masked_fill(~keep, float("-inf"))


def sampling_distribution(logits: Tensor, temperature: float = 1.0, top_k: int | None = None,
                          top_p: float | None = None) -> Tensor:
    """q = softmax(nucleus_p(top_k(z / τ))) for τ > 0; the one-hot of argmax z for τ = 0
    (torch.argmax returns the first maximum: the lowest id at a tie). (…, V) → (…, V)."""
    check_sampling_settings(temperature, top_k, top_p)
    z = logits.to(_sampling_dtype(logits.dtype))
    if temperature == 0:
        best = torch.argmax(z, dim=-1, keepdim=True)
        return torch.zeros_like(z).scatter(-1, best, 1.0)
    z = z / temperature
    if top_k is not None:
        z = top_k_filter(z, top_k)
    if top_p is not None:
        z = nucleus_filter(z, top_p)
    return torch.softmax(z, dim=-1)


class NonFiniteLogits(ValueError):
    """The model's logits hold a NaN or an infinity: there is no distribution to draw from."""


def sample(logits: Tensor, sampling: Sampling, generator: torch.Generator | None) -> Tensor:
    """One token per row of ``logits`` (B, V) → (B,)."""
    if sampling.greedy:
        # torch.max's index is argmax's (the first maximum), and faster on 16-bit CPU rows
        return torch.max(logits, dim=-1).indices
    q = sampling_distribution(logits, sampling.temperature, sampling.top_k, sampling.top_p)
    if not bool(torch.isfinite(q).all()):
        if not bool(torch.isfinite(logits).all()):
            raise NonFiniteLogits("the model's logits are NaN or infinite (diverged weights?)")
        # finite logits, but z / τ overflowed (a tiny temperature): softmax is unchanged by
        # subtracting the row's maximum first, after which z / τ ≤ 0 cannot overflow
        z = logits.to(_sampling_dtype(logits.dtype))
        shifted = z - z.max(dim=-1, keepdim=True).values
        q = sampling_distribution(shifted, sampling.temperature, sampling.top_k, sampling.top_p)
        if not bool(torch.isfinite(q).all()):
            # τ itself rounds to 0 in the sampling dtype (5e-324 in float32): the limit
            # of softmax(z / τ) as τ → 0 is the most likely token, which greedy picks
            return torch.max(logits, dim=-1).indices
    # multinomial never draws a category of probability 0: draws stay in the filtered set
    return torch.multinomial(q, 1, generator=generator)[:, 0]
