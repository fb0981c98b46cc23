"""Running the suite against one backend: checks in dependency order, each isolated
from the others, so that a failure is reported where it starts and the run goes on."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from gptspec.conformance.budgets import Precision
from gptspec.conformance.context import CheckContext, CheckFailure, NotImplementedOp, suite_settings
from gptspec.conformance.registry import Check, all_checks

STATUSES = ("pass", "fail", "not-implemented", "blocked", "error")


@dataclass
class CheckResult:
    id: str
    entries: list[str]
    kind: str
    status: str
    worst_fraction: float | None  # worst |diff| / budget over every comparison made
    detail: str  # the worst comparison, or what went wrong
    examples: int
    comparisons: int
    seconds: float
    budget: str
    minimal_example: str = ""
    reproduce: str = ""
    blocked_by: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SuiteResult:
    backend: dict[str, str]
    settings: dict[str, Any]
    results: list[CheckResult] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in STATUSES}

    @property
    def ok(self) -> bool:
        return not any(r.status in ("fail", "error", "blocked") for r in self.results)


def describe_backend(backend: Any) -> dict[str, str]:
    return {k: str(getattr(backend, k, "?")) for k in ("name", "version", "device", "dtype")}


def _missing_ops(backend: Any, check: Check) -> list[str]:
    return [op for op in check.ops if not callable(getattr(backend, op, None))]


def _first(err: BaseException) -> BaseException:
    """Hypothesis raises a group when it finds several distinct failures."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return err


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


def run_check(check: Check, backend: Any, precision: Precision, profile: str,
              seed: int) -> CheckResult:
    """Run one check; never raises (except KeyboardInterrupt)."""
    ctx = CheckContext(backend, precision, suite_settings(profile), seed)
    start = time.perf_counter()
    status, detail = "pass", ""
    try:
        check.fn(backend, ctx)
    except KeyboardInterrupt:
        raise
    except BaseException as raised:  # noqa: BLE001 — a backend may raise anything
        err = _first(raised)
        if isinstance(err, NotImplementedOp):
            status, detail = "not-implemented", f"backend has no operation {err}"
        elif isinstance(err, CheckFailure):
            status, detail = "fail", str(err)
        else:
            status = "error"
            where = traceback.extract_tb(err.__traceback__)
            origin = where[-1] if where else None
            at = f" (at {origin.filename.rsplit('/', 1)[-1]}:{origin.lineno})" if origin else ""
            detail = f"raised {_one_line(err)}{at}"
    worst: float | None = ctx.worst if ctx.comparisons else None
    if status == "pass":
        detail = ctx.worst_detail
    return CheckResult(
        id=check.id, entries=list(check.entries), kind=check.kind, status=status,
        worst_fraction=worst, detail=detail, examples=ctx.examples,
        comparisons=ctx.comparisons, seconds=time.perf_counter() - start,
        budget=check.budget, minimal_example="\n".join(ctx.falsifying).strip())


def run_suite(backend: Any, *, profile: str = "default", seed: int = 0,
              select: Callable[[Check], bool] | None = None, area: str | None = "forward",
              reproduce: str = "", on_result: Callable[[CheckResult], None] | None = None,
              header: Callable[[SuiteResult], None] | None = None,
              stop_on_failure: bool = False) -> SuiteResult:
    """Run every selected check against ``backend``, dependencies first. A check whose
    dependency failed is reported as blocked by the root cause, not run."""
    precision = Precision.of(str(getattr(backend, "dtype", "float64")))
    suite = SuiteResult(describe_backend(backend),
                        {"profile": profile, "seed": seed, "area": area or "all",
                         "examples_per_property": suite_settings(profile).max_examples})
    if header:
        header(suite)
    by_id: dict[str, CheckResult] = {}
    for check in all_checks(area):
        if select is not None and not select(check):
            continue
        missing = _missing_ops(backend, check)
        root = _root_cause(check, by_id)
        if missing:
            result = CheckResult(check.id, list(check.entries), check.kind, "not-implemented",
                                 None, f"backend has no operation {', '.join(missing)}", 0, 0,
                                 0.0, check.budget)
        elif root:
            result = CheckResult(check.id, list(check.entries), check.kind, "blocked", None,
                                 f"blocked by {root}, which failed", 0, 0, 0.0, check.budget,
                                 blocked_by=root)
        else:
            result = run_check(check, backend, precision, profile, seed)
            if result.status in ("fail", "error") and reproduce:
                result.reproduce = f"{reproduce} --check {check.id} --seed {seed}"
        by_id[check.id] = result
        suite.results.append(result)
        if on_result:
            on_result(result)
        if stop_on_failure and result.status in ("fail", "error"):
            break
    return suite


def _root_cause(check: Check, by_id: dict[str, CheckResult]) -> str:
    for dep in check.depends_on:
        r = by_id.get(dep)
        if r is None:
            continue
        if r.status in ("fail", "error"):
            return r.id
        if r.status == "blocked":
            return r.blocked_by
    return ""
