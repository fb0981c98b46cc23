"""The conformance checks as pytest items: ``python -m pytest --pyargs gptspec.conformance
--gptspec-backend=MODULE:ATTR`` collects one item per check id (dependencies first). Without
``--gptspec-backend`` this plugin (an entry point of every pytest run) imports nothing else.

Each item judges its check in the pytest process, the backend in a worker process that
serves its calls (``--gptspec-no-isolate``: in pytest's). A check whose dependencies have no
result in this process yet runs them first, so ``-k`` and ``-n`` give each check a whole
run's verdict: pass → passed; fail, error → failed; not implemented, not applicable →
skipped; blocked → skipped, or failed where ``-k`` left out the failed check. A session that
judged nothing ends with status 1 (``gptspec conformance``: 2, pytest's "interrupted").
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from gptspec.conformance.registry import Check
    from gptspec.conformance.runner import CheckResult

# not imported to be found: importing gptspec.conformance loads Hypothesis, NumPy and SciPy
_REGISTRY = (Path(__file__).parent / "conformance" / "registry.py").resolve()
DTYPES = ("float64", "float32", "bfloat16", "float16")
PROFILES = ("quick", "default", "thorough")  # context.PROFILES


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gptspec", "gptspec conformance (--pyargs gptspec.conformance)")
    group.addoption("--gptspec-backend", metavar="MODULE:ATTR",
                    help="module:attr or an installed backend name: collect the conformance "
                         "checks of gptspec.conformance as items judging it")
    group.addoption("--gptspec-dtype", choices=DTYPES,
                    help="the dtype to judge (default: the one the backend declares)")
    group.addoption("--gptspec-device", metavar="DEVICE",
                    help="the device to build the backend on (default: its own)")
    group.addoption("--gptspec-profile", choices=PROFILES, default="default",
                    help="Hypothesis examples per property: quick 12, default 30, thorough 200")
    group.addoption("--gptspec-seed", type=int, default=0, help="Hypothesis seed (default 0)")
    group.addoption("--gptspec-timeout", type=float, default=300.0, metavar="SECONDS",
                    help="time limit per check, as gptspec conformance's --timeout (default "
                         "300; 0 for none): it interrupts Python code, not a hung native call "
                         "(pytest-timeout's --timeout-method=thread ends those)")
    group.addoption("--gptspec-no-isolate", action="store_true",
                    help="build the backend in pytest's process, as gptspec conformance "
                         "--no-isolate (default: in a worker process that serves its calls, "
                         "so that it cannot reach the judge, hang or crash the session)")
    group.addoption("--gptspec-adjudicate-with", default="torch", metavar="MODULE:ATTR",
                    help="the plain backend a low-precision failure is compared with "
                         "(default torch; none: no adjudication)")


def pytest_configure(config: pytest.Config) -> None:
    target = config.getoption("gptspec_backend", None)
    if not target:
        return
    from gptspec.cli import CLIError, arguments
    from gptspec.cli.conformance import MAX_TIMEOUT
    from gptspec.conformance.discovery import BackendError, locate

    plain = config.getoption("gptspec_adjudicate_with")
    try:  # a misspelt module stops the run at once, in one line, before any item runs
        for flag, named in (("--gptspec-backend", target), ("--gptspec-adjudicate-with", plain)):
            if flag == "--gptspec-backend" or plain not in ("none", "torch"):
                try:
                    with _guarded():  # its module's os._exit: an error, not pytest's end
                        locate(named)
                except BackendError as err:
                    raise CLIError(f"{flag}: {err}") from None
        # the same limits as gptspec conformance's --timeout and --seed
        arguments.finite(config.getoption("gptspec_timeout"), "--gptspec-timeout (seconds; 0 "
                      "for none)", low=0, high=MAX_TIMEOUT)
        arguments.seed(config.getoption("gptspec_seed"), "--gptspec-seed")
    except CLIError as err:
        raise pytest.UsageError(str(err)) from None
    config.stash[_JUDGE] = _Judge(config)
    if not hasattr(config, "workerinput"):  # a pytest-xdist worker: its controller tallies
        config.pluginmanager.register(_Tally(config), "gptspec-tally")


def pytest_unconfigure(config: pytest.Config) -> None:
    judge = config.stash.get(_JUDGE, None)
    if judge is not None and judge.isolated is not None:
        judge.isolated.close()
    if judge is not None and judge.guard is not None:
        judge.guard.__exit__(None, None, None)


def pytest_report_header(config: pytest.Config) -> str | None:
    judge = config.stash.get(_JUDGE, None)
    return None if judge is None else f"gptspec conformance: {judge.described}"


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    # the suite's items hang off registry.py, where the checks are registered: a file of
    # the package that --pyargs gptspec.conformance walks, which pytest itself never collects
    if _JUDGE not in parent.config.stash or file_path.name != _REGISTRY.name \
            or file_path.resolve() != _REGISTRY:
        return None
    return Checks.from_parent(parent, path=file_path)


class Checks(pytest.File):
    """Every check, dependencies before dependents (so one process runs each once)."""

    def collect(self) -> Any:
        from gptspec.conformance.registry import all_checks

        for check in all_checks(None):
            yield CheckItem.from_parent(self, name=check.id, check=check)


class CheckItem(pytest.Item):
    def __init__(self, *, check: Check, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check = check
        self.extra_keyword_matches.add(check.area)  # -k training selects that area's checks

    def runtest(self) -> None:
        judge = self.config.stash[_JUDGE]
        result = judge.result(self.check)
        if result is None:  # the session's tally reads the property: nothing was judged
            self.user_properties.append(("gptspec_refused", judge.refused))
            raise pytest.skip.Exception(f"refused: {judge.refused} (nothing was judged)",
                                        _use_item_location=True)
        self.user_properties += [("gptspec_status", result.status),
                                 ("gptspec_worst_fraction", result.worst_fraction)]
        from gptspec.conformance import report

        if result.status in ("fail", "error"):
            # the console's lines, but the first made one line that pytest's summary and a
            # JUnit message show whole: its fraction of budget and what went wrong
            fraction = report.fraction_text(result)
            head = (result.detail if fraction == "-" or "of budget" in result.detail
                    else f"{fraction} of budget: {result.detail}")
            pytest.fail("\n".join([f"{result.status}: {head}",
                                    *report.line(result).split("\n")[2:]]), pytrace=False)
        if result.status == "blocked" and result.blocked_by not in {
                item.check.id for item in self.session.items if isinstance(item, CheckItem)}:
            # -k left out the check that failed: a skip would be this session's only trace
            # of that failure, and it would end green where the whole run fails
            pytest.fail(f"{result.detail} (not selected here: select it to see why)",
                        pytrace=False)
        reason = {"not-implemented": f"not implemented: {result.detail}",
                  "not-applicable": f"not applicable: {result.detail}",
                  "blocked": result.detail}.get(result.status)
        if reason is not None:  # reported at the check's code (reportinfo), not at this line
            raise pytest.skip.Exception(reason, _use_item_location=True)

    def reportinfo(self) -> tuple[Path, int, str]:
        code = self.check.fn.__code__
        return Path(code.co_filename), code.co_firstlineno - 1, f"check {self.check.id}"


class _Judge:
    """This process's backend, built at the first item, and the results it has so far."""

    def __init__(self, config: pytest.Config) -> None:
        option = config.getoption
        self.target: str = option("gptspec_backend")
        self.dtype: str | None = option("gptspec_dtype")
        self.device: str | None = option("gptspec_device")
        self.profile: str = option("gptspec_profile")
        self.seed: int = option("gptspec_seed")
        self.timeout: float | None = option("gptspec_timeout") or None
        plain = option("gptspec_adjudicate_with")
        self.plain: str | None = None if plain == "none" else plain
        self.known: dict[str, CheckResult] = {}
        self.started = False
        self.unusable = ""  # why no check can run: the backend failed to start
        self.isolate = not option("gptspec_no_isolate")
        self.isolated: Any = None  # isolation.IsolatedJudge, from the first item to the end
        self.guard: Any = None  # the in-process guard, from the first item to the session's end
        self.refused = ""  # the backend declined the dtype or device asked
        self.described = (f"backend {self.target}, dtype {self.dtype or 'its own'}, device "
                          f"{self.device or 'its own'}, profile {self.profile}, seed {self.seed}")

    def _start(self) -> None:
        from gptspec.conformance.discovery import BackendError, BackendRefused
        from gptspec.conformance.runner import judge, start_backend

        self.started = True
        if self.isolate:
            from gptspec.conformance.isolation import IsolatedJudge

            try:
                self.isolated = IsolatedJudge(
                    self.target, device=self.device, dtype=self.dtype, profile=self.profile,
                    seed=self.seed, timeout=self.timeout, plain=self.plain)
            except BackendRefused as err:
                self.refused = err.reason
            except BackendError as err:
                self.unusable = str(err)
            else:
                self.evaluate, self.unimplemented = self.isolated.evaluate, self.isolated.unmet
            return
        try:
            backend, origin = start_backend(self.target, device=self.device, dtype=self.dtype,
                                            timeout=self.timeout, flag="--gptspec-timeout")
        except BackendRefused as err:  # a subclass of BackendError
            self.refused = err.reason
            return
        except BackendError as err:
            self.unusable = str(err)
            return
        self.evaluate, self.unimplemented = judge(
            backend, profile=self.profile, seed=self.seed, timeout=self.timeout,
            origin=origin, plain=self.plain, dtype=self.dtype, device=self.device)

    def result(self, check: Check) -> CheckResult | None:
        """``check``'s result, its dependencies judged first where this process has not;
        None when the backend refused the dtype or device asked (``refused`` says why).
        With --gptspec-no-isolate the backend runs as under ``gptspec conformance
        --no-isolate``: its os._exit is an error of the check that called it, not pytest's
        end with the backend's status."""
        if self.isolate:
            return self._result(check)
        if self.guard is None:  # for the whole session: processes the backend starts
            self.guard = _guarded()  # (a compiler's worker pool) live until its end
            self.guard.__enter__()
        result = self._result(check)
        code = self.guard.take_exit()
        if result is not None and code is not None and result.status not in ("fail", "error"):
            # os._exit where Python swallowed its SystemExit (a finalizer)
            result.status, result.worst_fraction = "error", None
            result.detail = (f"the backend called os._exit({code!r}) in pytest's process, "
                             "where Python ignored it (a finalizer)")
        return result

    def _result(self, check: Check) -> CheckResult | None:
        if not self.started:
            self._start()
        if self.unusable:
            pytest.fail(self.unusable, pytrace=False)
        if self.refused:
            return None
        if check.id not in self.known:
            from gptspec.conformance.registry import all_checks
            from gptspec.conformance.runner import reproduce_command, walk

            needed = _closure(check)
            todo = [c for c in all_checks(None) if c.id in needed and c.id not in self.known]
            reproduce = reproduce_command(self.target, self.profile, "all", self.dtype,
                                          self.device)
            for _ in walk(todo, None, self.evaluate, reproduce, self.seed,
                          self.unimplemented, self.known):
                pass
        return self.known[check.id]


class _Tally:
    """The session's verdict on the checks as a whole, mirroring ``gptspec conformance``:
    checks that all ended refused, not implemented or not applicable judged nothing, and
    a run that judges nothing passes nothing. Kept where the reports arrive: the one
    process, or pytest-xdist's controller."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.ran = 0  # items of the checks that reported their call
        self.judged = False
        self.refused = ""
        self.unjudged_example = ""  # "check id: reason" of one not implemented or applicable

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        properties = dict(report.user_properties)
        if report.when != "call" or not properties.keys() & {"gptspec_status",
                                                             "gptspec_refused"}:
            return
        self.ran += 1
        status = properties.get("gptspec_status")
        if status is None:
            self.refused = self.refused or str(properties["gptspec_refused"])
        elif status not in ("not-implemented", "not-applicable"):
            self.judged = True
        # a skip's (path, line, reason); a list when it comes from a pytest-xdist worker
        elif not self.unjudged_example and isinstance(report.longrepr, (tuple, list)):
            reason = str(report.longrepr[2]).removeprefix("Skipped: ")
            self.unjudged_example = f"{report.nodeid.rsplit('::', 1)[-1]}: {reason}"

    def nothing_judged(self) -> str:
        """Why the session judged nothing (the CLI's line), or "" when it judged a check
        or ran none."""
        if not self.ran or self.judged:
            return ""
        if self.refused and not self.unjudged_example:
            option = self.config.getoption
            return (f"nothing was judged: the backend refused every run asked "
                    f"({option('gptspec_dtype') or 'its default dtype'} on "
                    f"{option('gptspec_device') or 'its default device'}: {self.refused})")
        example = f" (e.g. {self.unjudged_example})" if self.unjudged_example else ""
        return (f"nothing was judged: the backend implements none of the {self.ran} checks "
                f"asked, or cannot express them{example}")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if session.exitstatus == pytest.ExitCode.OK and self.nothing_judged():
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        why = self.nothing_judged()
        if why:
            terminalreporter.write_sep("=", "gptspec conformance", red=True)
            terminalreporter.write_line(why, red=True)


def _guarded() -> Any:
    from gptspec.cli.in_process import InProcessGuard

    # no watchdog (pytest-timeout's --timeout-method=thread ends a hung native call)
    return InProcessGuard(None, lambda waited: None, mode="the pytest plugin")


def _closure(check: Check) -> set[str]:
    from gptspec.conformance.registry import CHECKS

    needed, todo = set(), [check.id]
    while todo:
        id_ = todo.pop()
        if id_ not in needed:
            needed.add(id_)
            todo.extend(CHECKS[id_].depends_on)
    return needed


_JUDGE = pytest.StashKey[_Judge]()
