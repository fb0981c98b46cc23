"""gptspec.conformance — validate any backend against the float64 reference.

``run_suite(backend)`` runs every check (see :mod:`gptspec.conformance.registry`);
budgets are derived in :mod:`gptspec.conformance.budgets`.
"""

from gptspec.conformance.budgets import Precision, compare, round_to
from gptspec.conformance.discovery import BackendError, load_backend, registered
from gptspec.conformance.protocol import PROTOCOL_VERSION, Backend, NotApplicable
from gptspec.conformance.registry import CHECKS, Check, all_checks, check, checks_for
from gptspec.conformance.runner import CheckResult, SuiteResult, run_suite

__all__ = ["CHECKS", "PROTOCOL_VERSION", "Backend", "BackendError", "Check", "CheckResult",
           "NotApplicable", "Precision",
           "SuiteResult", "all_checks", "check", "checks_for", "compare", "load_backend",
           "registered", "round_to", "run_suite"]
