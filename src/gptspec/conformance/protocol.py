"""What a backend provides to be validated (docs/backend.md says it for authors).

Required: ``protocol_version`` (:data:`PROTOCOL_VERSION`), ``name``, ``version``,
``device``, ``dtype`` (float64, float32, bfloat16 or float16) and
``forward(tokens, params, config) -> logits``: params float64 NumPy arrays named by
:func:`gptspec.spec.parameter_schema`, tokens int64 (B, T), logits (B, T, V) holding
``dtype`` values. Optional: any operation under the name and signature of its reference
function in :mod:`gptspec.reference`; a missing one is reported as not implemented.
``supports(config)`` or raising :class:`NotApplicable` declares what an engine cannot
express: such examples are skipped and counted, not failed. Isolation builds the backend
again in a worker from its spec, so all it needs must come from its constructor.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from gptspec.spec.config import GPTConfig

PROTOCOL_VERSION = 2
"""The protocol this suite speaks. Version 1 (no ``protocol_version`` attribute) took the
configuration first: ``forward(config, params, tokens)``, ``generate(params, config,
prompts, ...)``, ``train_loop(config, params, tokens, ...)``."""

PROTOCOL_HISTORY = {
    1: "forward(config, params, tokens)",
    2: "forward(tokens, params, config)",
}  # each version's telltale signature, for the message that names a mismatch


SHOWN_LIMIT = 2000  # characters of one backend-supplied string a report or terminal shows


def shown(text: object, limit: int = SHOWN_LIMIT, *, lines: bool = False) -> str:
    """A string a backend supplied (its name, version, an exception's message), as the
    judge prints or writes it: control characters and escape sequences spelled as Python
    escapes (``\\x1b``, ``\\n``), so that a backend cannot clear the screen or forge a
    verdict line, and at most ``limit`` characters, the rest counted. ``lines``: keep its
    line breaks (a falsifying example), escaping everything else."""
    try:
        text = str(text)
    except Exception:  # noqa: BLE001 — a backend's __str__ may raise anything
        return "(unprintable)"
    rest = len(text) - limit
    visible = "".join(c if c.isprintable() or (lines and c == "\n") else repr(c)[1:-1]
                      for c in text[:limit])
    return f"{visible}… ({rest} more characters)" if rest > 0 else visible


class NotApplicable(Exception):
    """Raised by a backend for an input its engine cannot express (e.g. a post-LN block in
    an engine whose model is pre-LN); the message says why, in one line."""


@runtime_checkable
class Backend(Protocol):
    protocol_version: int
    name: str
    version: str
    device: str
    dtype: str

    def forward(self, tokens: np.ndarray, params: dict[str, np.ndarray], config: GPTConfig) -> Any: ...
