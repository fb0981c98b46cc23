"""What a backend provides to be validated.

Required: ``protocol_version`` (the integer :data:`PROTOCOL_VERSION`: the protocol the
backend was written against), ``name``, ``version``, ``device``, ``dtype`` (strings; the
dtype one of float64, float32, bfloat16, float16) and
``forward(tokens, params, config) -> logits``:
``config`` a :class:`gptspec.spec.GPTConfig`, ``params`` a dict of float64 NumPy arrays
named by :func:`gptspec.spec.parameter_schema`, ``tokens`` int64 (B, T); the logits
(B, T, V) as an array of any float dtype whose values are ``dtype`` values (a list, or
values computed in a wider dtype, is an error: the run judges the dtype asked).

Every function of the protocol takes its arguments in one order: the inputs first (tokens,
prompts, activations), then the parameters, then the configuration, then options
(``forward(tokens, params, config)``, ``generate(prompts, params, config, max_new_tokens,
...)``, ``train_loop(tokens, params, config, settings)``); the order the reference
functions use. The optimizer's operations update the parameters, so the parameters are
their input and come first (``adamw_step(theta, g, m, v, t, lr, ...)``,
``adamw_trajectory(params, grads, lrs, ...)``).

Optional: any operation under the name and signature of its reference function in
:mod:`gptspec.reference` (NumPy float64 in, rounded by the backend to its dtype; NumPy
out). Each lets the suite check that operation on its own, so a failure is localised;
a missing one is reported as not implemented.

Declaring what a backend cannot express (an engine with one fixed architecture): an
optional ``supports(config) -> str | None`` returns None for a configuration the backend
can run and a one-line reason for one it cannot; and any call may raise
:class:`NotApplicable` with a one-line reason for an input outside what the engine
expresses. Either way the example is skipped and counted as not applicable, not failed;
a check none of whose examples applies is reported as not applicable.

Discovery (:mod:`gptspec.conformance.discovery`): ``--backend module:attr`` or a name
registered in the ``gptspec.backends`` entry-point group; a class or factory is called
with the ``device`` and ``dtype`` keyword arguments it accepts. Isolation
(:mod:`gptspec.conformance.isolation`) builds the backend again in a worker process from
that same spec, so everything a backend needs must come from its constructor.
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
