"""What a backend provides to be validated.

Required: ``name``, ``version``, ``device``, ``dtype`` (strings; the dtype one of
float64, float32, bfloat16, float16) and ``forward(config, params, tokens) -> logits``:
``config`` a :class:`gptspec.spec.GPTConfig`, ``params`` a dict of float64 NumPy arrays
named by :func:`gptspec.spec.parameter_schema`, ``tokens`` int64 (B, T); the logits
(B, T, V) as an array of any float dtype.

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


class NotApplicable(Exception):
    """Raised by a backend for an input its engine cannot express (e.g. a post-LN block in
    an engine whose model is pre-LN); the message says why, in one line."""


@runtime_checkable
class Backend(Protocol):
    name: str
    version: str
    device: str
    dtype: str

    def forward(self, config: GPTConfig, params: dict[str, np.ndarray],
                tokens: np.ndarray) -> Any: ...
