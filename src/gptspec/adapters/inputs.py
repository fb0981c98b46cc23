"""What the adapters refuse before their engine sees it, in one line each: an engine's own
response to a bad token id is worse (jnp's indexing clamps it, ONNX Runtime's Gather fails
with a long message), so every adapter checks ids, shapes and generation settings the same way first."""

from __future__ import annotations

import numpy as np

from gptspec.reference.sampling import check_sampling_settings
from gptspec.spec.config import GPTConfig
from gptspec.spec.parameters import check_parameters


def check_ids(ids: np.ndarray, vocab_size: int) -> None:
    """Integer ids in [0, V)."""
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"token ids must be integers, got dtype {ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got "
                         f"[{ids.min()}, {ids.max()}]")


def check_tokens(tokens: np.ndarray, config: GPTConfig) -> None:
    """An array (…, T) of ids with T ≤ n_ctx."""
    if tokens.ndim < 1:
        raise ValueError(f"tokens must be an array (…, T), got shape {tokens.shape}")
    if tokens.shape[-1] > config.n_ctx:
        raise ValueError(f"sequence length {tokens.shape[-1]} exceeds n_ctx={config.n_ctx}")
    check_ids(tokens, config.vocab_size)


def check_generation(prompts, params: dict, config: GPTConfig, max_new_tokens: int,
                     temperature: float, top_k: int | None, top_p: float | None,
                     rng) -> list[list[int]]:
    """generate's arguments, refused in one line each; the prompts as lists of ids."""
    check_sampling_settings(temperature, top_k, top_p)
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be ≥ 0, got {max_new_tokens}")
    if temperature > 0 and rng is None:
        raise ValueError("sampling (temperature > 0) needs an explicit seeded rng")
    sequences = [[int(t) for t in np.asarray(p).reshape(-1)] for p in prompts]
    for b, seq in enumerate(sequences):
        if not seq:
            raise ValueError(f"prompt {b} is empty: generation needs at least one token")
        check_ids(np.asarray(seq), config.vocab_size)
    check_parameters(params, config)
    return sequences
