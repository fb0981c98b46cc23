"""What the fast model measurably costs: its parameter shapes, the FLOPs torch counts,
the bytes of its KV cache and of the activations autograd keeps. The conformance suite
compares these with the spec's size and cost formulas (checks_costs)."""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from gptspec.fast.kv_cache import KVCache
from gptspec.fast.model import GPT
from gptspec.spec.config import GPTConfig


def parameter_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """The shape of every parameter the model has (built on the meta device: no memory)."""
    model = GPT(config, device="meta")
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


def _model_and_tokens(config: GPTConfig, batch: int, T: int) -> tuple[GPT, torch.Tensor]:
    model = GPT(config)
    tokens = torch.randint(0, config.vocab_size, (batch, T), generator=torch.Generator().manual_seed(0))
    return model, tokens


def count_flops(config: GPTConfig, batch: int, T: int, backward: bool = False) -> int:
    """FLOPs torch counts for a forward (and backward) pass of (batch, T) tokens, with the
    math attention kernel so that Q Kᵀ and A V are counted as the matrix products they are."""
    model, tokens = _model_and_tokens(config, batch, T)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        logits = model(tokens)
        if backward:
            logits.sum().backward()
    return int(counter.get_total_flops())


def kv_cache_nbytes(config: GPTConfig, batch: int, dtype: torch.dtype) -> int:
    """Bytes of the keys and values a full-context KV cache holds (its n_ctx slots; the
    allocation has one scratch slot more, where padding tokens write)."""
    cache = KVCache(config, batch, device="meta", dtype=dtype)
    return cache.k.nbytes + cache.v.nbytes


def saved_activation_bytes(config: GPTConfig, batch: int, T: int) -> int:
    """Bytes of the distinct tensors autograd saves for the backward pass of a float32
    forward and its cross-entropy loss (parameters excluded), with the math attention
    kernel (weights materialised)."""
    model, tokens = _model_and_tokens(config, batch, T)
    saved: list[torch.Tensor] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with sdpa_kernel(SDPBackend.MATH), torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        logits = model(tokens)  # a training step's loss: cross-entropy keeps its softmax
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved}
    return sum(n for ptr, n in storages.items() if ptr not in params)
