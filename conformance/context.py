"""What a check runs in: the Hypothesis settings of the run, and the record of its
comparisons (the worst fraction of budget, and the example that produced it)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import hypothesis
from hypothesis import HealthCheck, settings

from gptspec.conformance.budgets import Comparison, Precision

PROFILES = {"quick": 12, "default": 30, "thorough": 200}


class CheckFailure(AssertionError):
    """A comparison outside its budget, or a property that does not hold."""


class NotImplementedOp(Exception):
    """The backend does not provide an optional operation."""


def suite_settings(profile: str) -> settings:
    """Hypothesis settings for a profile. Under CI the library's own ``ci`` profile
    (derandomized, no database) is the base, extended rather than replaced."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    base = settings.get_profile("ci") if os.environ.get("CI") else settings()
    return settings(
        base,
        max_examples=PROFILES[profile],
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.filter_too_much],
    )


@dataclass
class CheckContext:
    backend: Any
    precision: Precision
    settings: settings
    seed: int = 0
    worst: float = 0.0
    worst_detail: str = ""
    comparisons: int = 0
    examples: int = 0
    falsifying: list[str] = field(default_factory=list)

    def op(self, name: str) -> Callable[..., Any]:
        """The backend's operation ``name``, or NotImplementedOp."""
        fn = getattr(self.backend, name, None)
        if fn is None or not callable(fn):
            raise NotImplementedOp(name)
        return fn

    def record(self, what: str, comparison: Comparison) -> None:
        """Record a comparison; fail the example if it is outside its budget."""
        self.comparisons += 1
        if comparison.problem or comparison.fraction > self.worst:
            self.worst = max(self.worst, comparison.fraction)
            self.worst_detail = f"{what}: {comparison.describe()}"
        if not comparison.passed:
            raise CheckFailure(f"{what}: {comparison.describe()}")

    def require(self, condition: bool, message: str) -> None:
        """A property that must hold exactly."""
        self.comparisons += 1
        if not condition:
            raise CheckFailure(message)

    def given(self, *args: Any, **kwargs: Any) -> Callable[[Callable[..., None]], None]:
        """Run the decorated property now, over Hypothesis-generated examples, with the
        run's settings and seed. Usage::

            @ctx.given(z=arrays(...))
            def _(z): ...
        """

        def run(test: Callable[..., None]) -> None:
            def counted(*a: Any, **k: Any) -> None:
                self.examples += 1
                test(*a, **k)

            counted.__name__ = test.__name__
            wrapped = hypothesis.seed(self.seed)(self.settings(hypothesis.given(*args, **kwargs)(counted)))
            reports: list[str] = []
            with hypothesis.reporting.with_reporter(reports.append):
                try:
                    wrapped()
                except BaseException as err:
                    # Hypothesis attaches the falsifying example to the exception's notes
                    # (and, in older versions, sends it to the reporter).
                    first = err
                    while isinstance(first, BaseExceptionGroup) and first.exceptions:
                        first = first.exceptions[0]
                    notes = getattr(first, "__notes__", []) or getattr(err, "__notes__", [])
                    # (its @reproduce_failure hint names our inner test: the report gives
                    # the command that reproduces the check instead)
                    self.falsifying.extend(str(n) for n in notes
                                           if "reproduce_failure" not in str(n))
                    self.falsifying.extend(str(r) for r in reports if str(r) not in notes)
                    raise

        return run
