"""gptspec.spec — the single source of truth.

Importing this package declares every entry into :data:`REGISTRY`, in reading order.
"""

from gptspec.spec import (  # noqa: F401  (each module declares its entries)
    attention,
    block,
    costs,
    embedding,
    gradients,
    loss,
    optimizer,
    output,
    sampling,
    tokenizer,
)
from gptspec.spec.config import PRESETS, ConfigError, GPTConfig, preset
from gptspec.spec.equation import GROUPS, REGISTRY, Decision, Equation, Reading, Symbol, Tolerance
from gptspec.spec.parameters import (
    ParameterError,
    ParameterSpec,
    check_parameters,
    init_parameters,
    parameter_count,
    parameter_schema,
)

__all__ = [
    "GROUPS", "REGISTRY", "PRESETS", "ConfigError", "Decision", "Equation", "GPTConfig",
    "ParameterError", "ParameterSpec", "Reading", "Symbol", "Tolerance", "check_parameters",
    "init_parameters", "parameter_count", "parameter_schema", "preset",
]
