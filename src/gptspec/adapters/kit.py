"""A kit for adapter authors: what every adapter otherwise writes again.

- :func:`forward_operations` — the optional operations of the model, read from the spec
  registry (gptspec.spec.operations), and :func:`operations_in`, an ops module's own;
- :class:`OptionalOperations` — ``implemented_ops()``, the operations as attributes and
  ``dir()`` for a backend built on one module of functions named like the reference's;
- :func:`generate_by_forward` — ``generate`` around an engine's last rows of logits
  (cropping, stop conditions, one uniform per drawn token), its own distribution optional;
- :class:`LogitsOnly` — a backend seen as a logits-only engine. No engine imported here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from gptspec.adapters.inputs import check_generation
from gptspec.reference.sampling import sample_token, sampling_distribution
from gptspec.spec.config import GPTConfig
from gptspec.spec.operations import OptionalOperations, forward_operations, operations_in

__all__ = ["LogitsOnly", "OptionalOperations", "forward_operations", "generate_by_forward",
           "operations_in"]

LastRows = Callable[[list[list[int]]], Any]  # contexts → their last rows of logits (B, V)
Distribution = Callable[..., Any]  # (rows, temperature, top_k, top_p) → (B, V)


def generate_by_forward(last_rows: LastRows, prompts: Sequence[Any], params: Mapping[str, Any],
                        config: GPTConfig, max_new_tokens: int, *, temperature: float = 1.0,
                        top_k: int | None = None, top_p: float | None = None,
                        eot_token: int | None = None, rng: np.random.Generator | None = None,
                        return_logits: bool = False,
                        distribution: Distribution | None = None) -> Any:
    """The protocol's ``generate`` for an engine that computes logits.

    ``last_rows(contexts)`` gets the unfinished sequences' contexts (lists of ids, each
    cropped to its last n_ctx) and returns the logits (B, V) of each one's last position,
    in the engine's dtype (any array NumPy can convert). ``distribution(rows, temperature,
    top_k, top_p)`` returns the (B, V) distributions each token is drawn from; by default
    the reference's ``sampling_distribution`` of the rows. Every unfinished sequence takes
    one step at a time; τ = 0 takes the lowest-id maximum of the distribution, τ > 0 one
    uniform of ``rng`` per token (``sample_token``), step by step, then sequence by
    sequence. A sequence stops at ``eot_token`` (kept) or after ``max_new_tokens``.

    Returns the new tokens per prompt and, with ``return_logits``, the (n, V) float32
    logits each was drawn from (16-bit values widened exactly)."""
    top_k = int(top_k) if isinstance(top_k, np.integer) else top_k
    sequences = check_generation(prompts, dict(params), config, max_new_tokens, temperature,
                                 top_k, top_p, rng)
    assert temperature == 0 or rng is not None  # check_generation refuses sampling without
    if distribution is None:
        def distribution(rows: Any, tau: float, k: int | None, p: float | None) -> Any:
            return sampling_distribution(np.asarray(rows, dtype=np.float64), tau, k, p)

    new: list[list[int]] = [[] for _ in sequences]
    logits: list[list[np.ndarray]] = [[] for _ in sequences]
    active = list(range(len(sequences))) if max_new_tokens > 0 else []
    while active:
        rows = last_rows([sequences[b][-config.n_ctx:] for b in active])
        q = np.asarray(distribution(rows, temperature, top_k, top_p), dtype=np.float64)
        widened = np.asarray(rows).astype(np.float32)
        still = []
        for row, b in enumerate(active):
            token = (int(np.argmax(q[row])) if temperature == 0
                     else sample_token(q[row], rng))  # type: ignore[arg-type]
            sequences[b].append(token)
            new[b].append(token)
            logits[b].append(widened[row])
            if not ((eot_token is not None and token == eot_token)
                    or len(new[b]) >= max_new_tokens):
                still.append(b)
        active = still
    if not return_logits:
        return new
    return new, [np.asarray(r, dtype=np.float32).reshape(len(r), config.vocab_size)
                 for r in logits]


class LogitsOnly:
    """``backend`` as most engines are brought: its identity, ``forward`` and, where it
    declares one, ``supports``; none of its other operations reach the judge."""

    protocol_version = 2

    def __init__(self, backend: Any, name: str | None = None) -> None:
        self._backend = backend
        self.name = name or f"{backend.name} (logits only)"
        self.version, self.device, self.dtype = backend.version, backend.device, backend.dtype
        if callable(getattr(backend, "supports", None)):
            self.supports = backend.supports

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._backend!r})"

    def forward(self, tokens: Any, params: Any, config: GPTConfig) -> Any:
        return self._backend.forward(tokens, params, config)
