"""Batched generation with a preallocated KV cache, streaming tokens as they are produced.

``stream`` yields each step's new token of every running sequence; ``generate`` drains it.
Its meaning is the reference loop (``gptspec.reference.generate``). Prompts of different
lengths are right-padded and fed once, so a prompt gives the same tokens alone or in a
batch; each sequence stops on its own; a context reaching n_ctx is cropped and the cache
refilled. 16-bit CPU weights are prepacked while it generates (``fast.prepacked``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from gptspec.fast import prepacked
from gptspec.fast.kv_cache import KVCache
from gptspec.fast.model import GPT
from gptspec.fast.sampling import GREEDY, Sampling, sample

Tensor = torch.Tensor


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


GRAPH_MIN_STEPS = 8  # fewer steps left than this: capturing one costs more than it saves


def _capture(step: Callable[[], Tensor]) -> tuple[Callable[[], object], Tensor]:
    """``step`` captured as a CUDA graph: (replay, the output it writes on each replay).
    One run beforehand, on a side stream, keeps lazy initialisation out of the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph.replay, out


class _GraphedStep:
    """``model(new[:, None], cache)`` for every sequence at once, planned on the device
    (``KVCache.static_plan``) and replayed from one CUDA graph: a launch per token, where
    the eager step launches some 200 kernels. Capturing runs the step once, writing past
    every sequence's length (slots nothing attends before a real token overwrites them);
    the lengths are put back."""

    def __init__(self, model: GPT, cache: KVCache) -> None:
        self.cache = cache
        self.token = torch.zeros(cache.batch_size, 1, dtype=torch.long, device=cache.device)
        lengths = cache.lengths.clone()
        self.replay, self.logits = _capture(
            lambda: model.run(self.token, cache.static_plan(), last_only=True)[:, 0])
        cache.lengths.copy_(lengths)

    def __call__(self, new: Tensor) -> Tensor:
        self.token.copy_(new[:, None])
        self.replay()
        return self.logits.clone()  # the next replay overwrites the graph's own


def _graphable(device: torch.device) -> bool:
    return device.type == "cuda"


class _Contexts:
    """The batch's token sequences and what the model has seen of them."""

    def __init__(self, model: GPT, prompts: list[list[int]], use_cache: bool, prepack: bool,
                 cuda_graph: bool) -> None:
        self.model = model
        self.sequences = prompts
        self.n_ctx = model.config.n_ctx
        self.device = model.wte.device
        self.use_cache = use_cache
        self.cache: KVCache | None = None  # None: no cache, or not filled yet
        self.graphed: _GraphedStep | None = None  # the step's graph, for this cache
        self.cuda_graph = cuda_graph and _graphable(self.device)
        # the weights packed where that pays (at batch 1 in the layout for one-row products)
        # and bound to the model while it generates; one the caller changes meanwhile goes
        # stale, and its products take the plain kernel
        if prepack:
            prepacked.bind(model, rows=len(prompts))
        else:
            prepacked.unbind(model)

    def full_forward(self, remaining: int) -> Tensor:
        """Logits (B, V) at the last position of every cropped context, from scratch;
        with a cache, the cache is refilled with those contexts."""
        contexts = [seq[-self.n_ctx :] for seq in self.sequences]  # crop_context
        lengths = [len(c) for c in contexts]
        T = max(lengths)
        tokens = torch.tensor([c + [0] * (T - len(c)) for c in contexts], device=self.device)
        last = torch.tensor(lengths, device=self.device) - 1
        rows = torch.arange(len(contexts), device=self.device)
        if not self.use_cache:
            return self.model(tokens)[rows, last]
        max_len = min(self.n_ctx, T + remaining)  # room for every token still to come
        if self.cache is None or self.cache.max_len < max_len:
            self.cache = self.model.new_cache(len(contexts), max_len)
        else:
            self.cache.reset()
        uniform = all(n == T for n in lengths)  # the cache's fast path needs no lengths
        lens = None if uniform else torch.tensor(lengths, device=self.device)
        return self.model(tokens, self.cache, lens)[rows, last]

    def needs_refill(self, running: list[bool]) -> bool:
        """Whether a running sequence has no room left in the cache: its context reached
        n_ctx (cropping moves every position) or the cache's length."""
        if self.cache is None:  # no cache: every step is a full forward
            return True
        if self.cache.uniform_length is not None:  # known without reading the device
            return self.cache.uniform_length >= self.cache.max_len
        fed = self.cache.lengths.tolist()
        return any(r and fed[b] >= self.cache.max_len for b, r in enumerate(running))

    def cached_step(self, new: Tensor, running: list[bool], remaining: int) -> Tensor:
        """Logits (B, V) after feeding each running sequence its newest token."""
        if all(running) and self.cuda_graph and self.cache is not None \
                and (self.graphed is not None or remaining >= GRAPH_MIN_STEPS):
            if self.graphed is None or self.graphed.cache is not self.cache:
                self.graphed = _GraphedStep(self.model, self.cache)
            return self.graphed(new)
        lens = None if all(running) else torch.tensor(running, device=self.device).long()
        return self.model(new[:, None], self.cache, lens)[:, 0]


@torch.inference_mode()
def stream(model: GPT, prompts: Sequence[Sequence[int]], max_new_tokens: int,
           sampling: Sampling = GREEDY, *, eot_token: int | None = None,
           seed: int | None = None, generator: torch.Generator | None = None,
           use_cache: bool = True, keep_logits: bool = False,
           prepack: bool = True, cuda_graph: bool = True) -> Iterator[Step]:
    """Generate up to ``max_new_tokens`` tokens after each prompt, yielding every step.

    ``seed`` (or an explicit ``generator`` on the model's device) fixes the draws;
    ``use_cache=False`` recomputes the full forward each step (the spec's definition);
    ``prepack=False`` multiplies by the parameters as they are (saves the packed copy's
    memory, where there is one: 16-bit weights on the CPU); ``cuda_graph=False`` launches
    a CUDA step's kernels one by one instead of replaying them as a graph."""
    config = model.config
    prompts_ = _check_prompts(prompts, config.vocab_size)
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer ≥ 0, got {max_new_tokens!r}")
    if eot_token is not None and not 0 <= eot_token < config.vocab_size:
        raise ValueError(f"eot_token {eot_token} lies outside [0, {config.vocab_size})")
    if generator is None and not sampling.greedy:
        generator = torch.Generator(device=model.wte.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
    if max_new_tokens == 0:
        return
    ctx = _Contexts(model, prompts_, use_cache, prepack, cuda_graph)
    try:
        running = [True] * len(prompts_)
        logits = ctx.full_forward(max_new_tokens)
        for n in range(1, max_new_tokens + 1):
            new = sample(logits, sampling, generator)
            tokens = [token if r else None for token, r in zip(new.tolist(), running, strict=True)]
            for b, token in enumerate(tokens):
                if token is not None:
                    ctx.sequences[b].append(token)
                    if token == eot_token or n == max_new_tokens:
                        running[b] = False  # stop_condition
            yield Step(n, tokens, [not r for r in running], logits if keep_logits else None)
            if not any(running):
                return
            if ctx.needs_refill(running):
                logits = ctx.full_forward(max_new_tokens - n)
            else:
                logits = ctx.cached_step(new, running, max_new_tokens - n)
    finally:
        prepacked.unbind(model)  # the packed products only inside generation's calls


def generate(model: GPT, prompts: Sequence[Sequence[int]], max_new_tokens: int,
             sampling: Sampling = GREEDY, *, eot_token: int | None = None,
             seed: int | None = None, generator: torch.Generator | None = None,
             use_cache: bool = True, on_token: Callable[[int, int], None] | None = None,
             return_logits: bool = False, prepack: bool = True, cuda_graph: bool = True):
    """The new tokens of every prompt (end-of-text included where it stopped a sequence).

    ``on_token(b, token)`` is called as each token is produced. With ``return_logits``,
    also each sequence's (n_b, V) tensor (float32 at least) of the logits its tokens were
    drawn from."""
    out: list[list[int]] = [[] for _ in prompts]
    step_logits: list[list[Tensor]] = [[] for _ in prompts]
    for step in stream(model, prompts, max_new_tokens, sampling, eot_token=eot_token, seed=seed,
                       generator=generator, use_cache=use_cache, keep_logits=return_logits,
                       prepack=prepack, cuda_graph=cuda_graph):
        for b, token in ((b, t) for b, t in enumerate(step.tokens) if t is not None):
            out[b].append(token)
            if step.logits is not None:  # return_logits: 16-bit logits widened to float32
                step_logits[b].append(step.logits[b].to("cpu", torch.promote_types(
                    step.logits.dtype, torch.float32)))
            if on_token is not None:
                on_token(b, token)
    if not return_logits:
        return out
    V = model.config.vocab_size
    return out, [torch.stack(s) if s else torch.empty(0, V) for s in step_logits]
