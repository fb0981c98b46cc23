"""What the adapters refuse before their engine sees it, in one line each: an engine's own
response to a bad token id is worse (jnp's indexing clamps it, ONNX Runtime's Gather fails
with a long message), so every adapter checks ids and shapes the same way first."""

from __future__ import annotations

import numpy as np

from gptspec.spec.config import GPTConfig


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
