"""What a backend provides to be validated (docs/backend.md says it for authors).

Required: ``protocol_version`` (:data:`PROTOCOL_VERSION`), ``name``, ``version``,
``device``, ``dtype`` (float64, float32, bfloat16 or float16) and ``forward(tokens,
params, config) -> logits``: params float64 NumPy arrays named by the parameter schema,
tokens int64 (B, T), logits (B, T, V) holding ``dtype`` values. Optional: any operation
under its reference function's name and signature; a missing one is not implemented.
``capabilities`` (names of :data:`CAPABILITIES`) declares the areas a backend implements
(``forward`` required only with "model"). ``supports(config)`` or raising
:class:`NotApplicable` declares what an engine cannot express: skipped, counted, not
failed. Isolation rebuilds the backend from its spec, so it needs only its constructor.
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
    except (Exception, SystemExit):  # noqa: BLE001 — a backend's __str__ may raise anything
        return "(unprintable)"
    rest = len(text) - limit
    visible = "".join(c if c.isprintable() or (lines and c == "\n") else repr(c)[1:-1]
                      for c in text[:limit])
    return f"{visible}… ({rest} more characters)" if rest > 0 else visible


CAPABILITIES = {
    "model": "forward(tokens, params, config), the forward pass's operations and the costs",
    "tokenizer": "tokenizer(): a tokenizer backend that trains, encodes and decodes",
    "gradients": "the loss and its gradients: gpt_backward",
    "optimizer": "AdamW and gradient-norm clipping: adamw_trajectory, clip_grad_norm",
    "schedule": "the learning-rate schedule: lr_schedule",
    "sampling": "the next-token distribution (sampling_distribution); with a model, generate",
}
"""The areas a backend may declare in ``capabilities``, each with what it provides. A
backend that declares none is read as the protocol before capabilities read every
backend: it has a model (``forward`` is required), and its other areas go as far as its
operations."""

# the areas an operation belongs to; every operation not listed (and forward) is the model's
OPERATION_CAPABILITIES: dict[str, tuple[str, ...]] = {
    "tokenizer": ("tokenizer",),
    "gpt_backward": ("gradients",),
    "adamw_trajectory": ("optimizer",),
    "clip_grad_norm": ("optimizer",),
    "lr_schedule": ("schedule",),
    "sampling_distribution": ("sampling",),
    "generate": ("model", "sampling"),
    "train_losses": ("model", "gradients", "optimizer", "schedule"),
    "train_loop": ("model", "gradients", "optimizer", "schedule"),
}


def needed_capabilities(ops: tuple[str, ...]) -> tuple[str, ...]:
    """The areas a backend must implement for a check that calls ``ops`` (a check that
    calls no optional operation calls ``forward``: the model's)."""
    needs: list[str] = []
    for op in ops or ("forward",):
        needs += [c for c in OPERATION_CAPABILITIES.get(op, ("model",)) if c not in needs]
    return tuple(needs)


def capability_problem(declared: object) -> str:
    """Why a backend's ``capabilities`` cannot be read as a set of areas, or ""."""
    if isinstance(declared, (str, bytes)) or not hasattr(declared, "__iter__"):
        return ("capabilities must be a collection of area names, not "
                f"{shown(repr(declared), 200)}")
    try:
        one_pass = iter(declared) is declared  # type: ignore[call-overload]
        names = [] if one_pass else list(declared)  # type: ignore[call-overload]
    except (Exception, SystemExit) as err:  # noqa: BLE001 — a backend's __iter__ may raise
        # anything: with --no-isolate it came out as the command's own error
        return (f"capabilities cannot be read: iterating it raised "
                f"{shown(type(err).__name__, 200)}: {shown(err, 200)}")
    if one_pass:  # read here, it was empty when the checks read it: "declares no area"
        return ("capabilities must be a collection of area names (a tuple), not an iterator "
                f"that reads once ({shown(type(declared).__name__, 200)})")
    unknown = [n for n in names if n not in CAPABILITIES]
    if unknown:
        return (f"capabilities names unknown areas {shown(', '.join(map(repr, unknown)), 200)}"
                f"; known: {', '.join(CAPABILITIES)}")
    if not names:
        return f"capabilities declares no area; known: {', '.join(CAPABILITIES)}"
    return ""


class CheckTimeout(BaseException):
    """The check ran past its time limit (a BaseException, so that Hypothesis does not
    take it for a failure to shrink). Here, beside the protocol, so that code catching
    whatever a backend raises can let the judge's own timer through."""


class WorkerLost(BaseException):
    """The worker serving an isolated backend's calls can answer no more (it died, or its
    channel carried what the worker does not write): the check is an error, and a fresh
    worker takes the next one. A BaseException, like a time-out, so that Hypothesis does
    not shrink on it."""


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
