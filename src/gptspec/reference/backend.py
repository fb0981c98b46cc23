"""The float64 reference as a conformance backend: the suite's own yardstick, which must
pass every check trivially (its budgets are those of float64)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import gptspec
from gptspec import reference
from gptspec.reference.output import gpt_forward
from gptspec.spec.config import GPTConfig


class ReferenceBackend:
    """Every reference function under its own name, and ``forward`` = ``gpt_forward``."""

    protocol_version = 2  # gptspec.conformance.protocol: forward(tokens, params, config)
    name = "reference"
    device = "cpu"
    dtype = "float64"
    version = f"gptspec {gptspec.__version__}, numpy {np.__version__}"

    def forward(self, tokens: Any, params: Mapping[str, Any], config: GPTConfig) -> np.ndarray:
        return gpt_forward(np.asarray(tokens), dict(params), config)

    @staticmethod
    def implemented_ops() -> list[str]:
        """Every reference function, by name."""
        return [name for name in reference.__all__ if name != "gpt_forward"]

    def __getattr__(self, name: str) -> Any:
        if name in reference.__all__:
            return getattr(reference, name)
        raise AttributeError(f"ReferenceBackend has no attribute or operation {name!r}")

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(reference.__all__))

    def __repr__(self) -> str:
        return "ReferenceBackend()"
