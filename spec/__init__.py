"""gptspec.spec — the single source of truth.

Importing this package declares every entry into :data:`REGISTRY`, in reading order.
"""

import importlib

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

# Each module declares its entries when imported; this order is the reading order of
# REGISTRY (and of the docs' index): text → tokens → model → loss → training → generation.
READING_ORDER = ("tokenizer", "embedding", "attention", "block", "output", "loss", "gradients",
                 "optimizer", "sampling", "costs")
for _module in READING_ORDER:
    importlib.import_module(f"gptspec.spec.{_module}")

__all__ = [
    "GROUPS", "REGISTRY", "PRESETS", "ConfigError", "Decision", "Equation", "GPTConfig",
    "ParameterError", "ParameterSpec", "Reading", "Symbol", "Tolerance", "check_parameters",
    "init_parameters", "parameter_count", "parameter_schema", "preset",
]
