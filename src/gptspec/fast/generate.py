"""Batched generation with a preallocated KV cache, streaming tokens as they are produced.

``stream(model, prompts, max_new_tokens, ...)`` yields, per step (one forward call for the
batch), the new token of every sequence still going; ``generate(...)`` drains it. Its
meaning is the reference loop (``gptspec.reference.generate``); the cache computes the
same logits from one new row per step. Prompts of different lengths are right-padded and
fed once, so a prompt gives the same tokens alone or in a batch; each sequence stops on
its own (end-of-text or length); a context reaching n_ctx is cropped and the cache
refilled. 16-bit CPU weights are prepacked and bound to the model while it generates
(``gptspec.fast.prepacked``), and sampling (temperature → top-k → nucleus) uses a seeded
``torch.Generator``: a fixed seed reproduces the tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from gptspec.fast import prepacked
from gptspec.fast.kv_cache import KVCache
from gptspec.fast.model import GPT
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
_HALF = (torch.float16, torch.bfloat16)


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


@dataclass
class Step:
    """One generation step: ``tokens[b]`` is sequence b's new token, None once it stopped.
    ``logits`` (B, V) are what the tokens were drawn from (kept when asked for)."""

    index: int  # n: how many new tokens each running sequence now has
    tokens: list[int | None]
    finished: list[bool]  # after this step
    logits: Tensor | None = None


def _check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int) -> list[list[int]]:
    if isinstance(prompts, (str, bytes)) or not len(prompts):
        raise ValueError("prompts must be a non-empty list of token lists")
    out = []
    for b, prompt in enumerate(prompts):
        tokens = [int(t) for t in prompt]
        if not tokens:
            raise ValueError(f"prompt {b} is empty: generation needs at least one token")
        bad = [t for t in tokens if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt {b} holds token id {bad[0]}, outside [0, {vocab_size})")
        out.append(tokens)
    return out


class _Contexts:
    """The batch's token sequences and what the model has seen of them."""

    def __init__(self, model: GPT, prompts: list[list[int]], max_new_tokens: int,
                 use_cache: bool, prepack: bool) -> None:
        self.model = model
        self.prepack = prepack
        self.sequences = prompts
        self.packed: prepacked.PrepackedWeights | None = None
        self.pack_weights()
        self.n_ctx = model.config.n_ctx
        self.device = model.wte.device
        self.max_new_tokens = max_new_tokens
        self.use_cache = use_cache
        self.cache: KVCache | None = None

    def pack_weights(self) -> None:
        """Bind the current weights, packed where that pays (at batch 1 in the layout for
        one-row products), to the model; with ``prepack=False``, none."""
        self.packed = None  # let a stale packed copy go first
        if self.prepack:
            self.packed = prepacked.bind(self.model, rows=len(self.sequences))
        else:
            prepacked.unbind(self.model)

    def forward(self, tokens: Tensor, cache: KVCache | None = None,
                lengths: Tensor | None = None) -> Tensor:
        if self.packed is not None and not self.packed.current:
            self.pack_weights()  # the caller changed the weights between two steps
        return self.model(tokens, cache, lengths)

    def context(self, b: int) -> list[int]:
        seq = self.sequences[b]
        return seq[max(0, len(seq) - self.n_ctx):]  # crop_context

    def full_forward(self, remaining: int) -> Tensor:
        """Logits (B, V) at the last position of every cropped context, from scratch;
        with a cache, the cache is refilled with those contexts."""
        contexts = [self.context(b) for b in range(len(self.sequences))]
        lengths = [len(c) for c in contexts]
        T = max(lengths)
        tokens = torch.zeros((len(contexts), T), dtype=torch.long)
        for b, c in enumerate(contexts):
            tokens[b, : len(c)] = torch.tensor(c)
        tokens = tokens.to(self.device)
        last = torch.tensor(lengths, device=self.device) - 1
        rows = torch.arange(len(contexts), device=self.device)
        if not self.use_cache:
            return self.forward(tokens)[rows, last]
        max_len = min(self.n_ctx, T + remaining)  # room for every token still to come
        if self.cache is None or self.cache.max_len < max_len:
            self.cache = self.model.new_cache(len(contexts), max_len)
        else:
            self.cache.reset()
        uniform = all(n == T for n in lengths)  # the cache's fast path needs no lengths
        lens = None if uniform else torch.tensor(lengths, device=self.device)
        return self.forward(tokens, cache=self.cache, lengths=lens)[rows, last]

    def needs_refill(self, running: list[bool]) -> bool:
        """Whether a running sequence has no room left in the cache: its context reached
        n_ctx (cropping moves every position) or the cache's length."""
        if not self.use_cache or self.cache is None:
            return True
        if self.cache.uniform_length is not None:  # known without reading the device
            return self.cache.uniform_length >= self.cache.max_len
        fed = self.cache.lengths.tolist()
        return any(r and fed[b] >= self.cache.max_len for b, r in enumerate(running))

    def cached_step(self, new: Tensor, running: list[bool]) -> Tensor:
        """Logits (B, V) after feeding each running sequence its newest token."""
        assert self.cache is not None
        lens = None if all(running) else torch.tensor(running, device=self.device).long()
        return self.forward(new[:, None], cache=self.cache, lengths=lens)[:, 0]


@torch.inference_mode()
def stream(model: GPT, prompts: Sequence[Sequence[int]], max_new_tokens: int,
           sampling: Sampling = GREEDY, *, eot_token: int | None = None,
           seed: int | None = None, generator: torch.Generator | None = None,
           use_cache: bool = True, keep_logits: bool = False,
           prepack: bool = True) -> Iterator[Step]:
    """Generate up to ``max_new_tokens`` tokens after each prompt, yielding every step.

    ``seed`` (or an explicit ``generator`` on the model's device) fixes the draws;
    ``use_cache=False`` recomputes the full forward each step (the spec's definition);
    ``prepack=False`` multiplies by the parameters as they are (saves the packed copy's
    memory, where there is one: 16-bit weights on the CPU)."""
    config = model.config
    prompts_ = _check_prompts(prompts, config.vocab_size)
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer ≥ 0, got {max_new_tokens!r}")
    if eot_token is not None and not 0 <= eot_token < config.vocab_size:
        raise ValueError(f"eot_token {eot_token} lies outside [0, {config.vocab_size})")
    device = model.wte.device
    if generator is None and not sampling.greedy:
        generator = torch.Generator(device=device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
    if max_new_tokens == 0:
        return
    B = len(prompts_)
    ctx = _Contexts(model, prompts_, max_new_tokens, use_cache, prepack)
    try:
        running = [True] * B
        logits = ctx.full_forward(max_new_tokens)
        for n in range(1, max_new_tokens + 1):
            new = sample(logits, sampling, generator)
            new_list = new.tolist()
            tokens: list[int | None] = []
            for b in range(B):
                if not running[b]:
                    tokens.append(None)
                    continue
                token = new_list[b]
                ctx.sequences[b].append(token)
                tokens.append(token)
                if (eot_token is not None and token == eot_token) or n >= max_new_tokens:
                    running[b] = False  # stop_condition
            yield Step(n, tokens, [not r for r in running], logits if keep_logits else None)
            if not any(running):
                return
            if ctx.needs_refill(running):
                logits = ctx.full_forward(max_new_tokens - n)
            else:
                logits = ctx.cached_step(new, running)
    finally:
        prepacked.unbind(model)  # the packed products only inside generation's calls


def generate(model: GPT, prompts: Sequence[Sequence[int]], max_new_tokens: int,
             sampling: Sampling = GREEDY, *, eot_token: int | None = None,
             seed: int | None = None, generator: torch.Generator | None = None,
             use_cache: bool = True, on_token: Callable[[int, int], None] | None = None,
             return_logits: bool = False, prepack: bool = True):
    """The new tokens of every prompt (end-of-text included where it stopped a sequence).

    ``on_token(b, token)`` is called as each token is produced. With ``return_logits``,
    also each sequence's (n_b, V) tensor (float32 at least) of the logits its tokens were
    drawn from."""
    out: list[list[int]] = [[] for _ in prompts]
    step_logits: list[list[Tensor]] = [[] for _ in prompts]
    for step in stream(model, prompts, max_new_tokens, sampling, eot_token=eot_token, seed=seed,
                       generator=generator, use_cache=use_cache, keep_logits=return_logits,
                       prepack=prepack):
        for b, token in enumerate(step.tokens):
            if token is None:
                continue
            out[b].append(token)
            if return_logits:
                assert step.logits is not None
                z = step.logits[b]
                step_logits[b].append((z.float() if z.dtype in _HALF else z).cpu())
            if on_token is not None:
                on_token(b, token)
    if return_logits:
        V = model.config.vocab_size
        return out, [torch.stack(s) if s else torch.empty(0, V) for s in step_logits]
    return out


def generate_from_parameters(model: GPT, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                             *, temperature: float = 1.0, top_k: int | None = None,
                             top_p: float | None = None, eot_token: int | None = None,
                             rng: np.random.Generator | None = None,
                             return_logits: bool = False):
    """``gptspec.reference.generate``'s signature over ``model``: the seed of the torch
    sampler is drawn from ``rng`` (a NumPy Generator), logits come back as NumPy arrays."""
    sampling = Sampling(temperature, top_k, top_p)
    if not sampling.greedy and rng is None:
        raise ValueError("sampling (temperature > 0) needs an explicit seeded rng")
    seed = None if rng is None else int(rng.integers(2**63 - 1))
    prompts_ = [[int(t) for t in np.asarray(p).reshape(-1)] for p in prompts]
    result = generate(model, prompts_, max_new_tokens, sampling, eot_token=eot_token, seed=seed,
                      return_logits=return_logits)
    if not return_logits:
        return result
    tokens, logits = result
    return tokens, [z.numpy() for z in logits]
