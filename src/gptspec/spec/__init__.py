"""gptspec.spec — the single source of truth.

:data:`REGISTRY` holds every entry, in reading order (declared when it is first read).
"""

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

# Each module declares its entries when imported (on the registry's first read); this
# order is the reading order of REGISTRY (and of the docs' index): text → tokens → model →
# loss → training → generation.
READING_ORDER = ("tokenizer", "embedding", "attention", "block", "output", "loss", "gradients",
                 "optimizer", "sampling", "costs")
REGISTRY.declare_on_first_use(tuple(f"gptspec.spec.{m}" for m in READING_ORDER))

__all__ = [
    "GROUPS", "REGISTRY", "PRESETS", "ConfigError", "Decision", "Equation", "GPTConfig",
    "ParameterError", "ParameterSpec", "Reading", "Symbol", "Tolerance", "check_parameters",
    "init_parameters", "parameter_count", "parameter_schema", "preset",
]
