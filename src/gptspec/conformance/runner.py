"""Running the suite against one backend: checks in dependency order, each isolated
from the others, so that a failure is reported where it starts and the run goes on.

A per-check time limit (``timeout``) is enforced here with an interval timer where that
is possible (the main thread on Unix; it interrupts Python code, not a hung native call);
:mod:`gptspec.conformance.isolation` runs the checks in a worker process instead, which
survives hangs of any kind and crashes of the interpreter.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import Any

import hypothesis.errors
import numpy as np

from gptspec.conformance.budgets import Precision
from gptspec.conformance.context import (
    STOPS_RECEIVED,
    CheckContext,
    CheckFailure,
    NotImplementedOp,
    RecordingBackend,
    WrongDtype,
    declared_capabilities,
    keeping_cwd,
    suite_settings,
)
from gptspec.conformance.protocol import (
    SHOWN_LIMIT,
    CheckTimeout,
    NotApplicable,
    WorkerLost,
    capability_problem,
    shown,
)
from gptspec.conformance.registry import Check, all_checks

STATUSES = ("pass", "fail", "not-implemented", "not-applicable", "blocked", "error")


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
    saved: list[str] = field(default_factory=list)  # the failing example's files
    adjudication: dict[str, Any] | None = None
    not_applicable: int = 0  # examples the backend declared it cannot express (skipped)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SuiteResult:
    backend: dict[str, str]
    settings: dict[str, Any]
    results: list[CheckResult] = field(default_factory=list)
    refused: str = ""  # why the backend declined the dtype or device asked (nothing ran)

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in STATUSES}

    @property
    def ok(self) -> bool:
        return not any(r.status in ("fail", "error", "blocked") for r in self.results)

    @property
    def judged(self) -> bool:
        """Whether any check reached a verdict (not all refused, not implemented or not
        applicable)."""
        return not self.refused and any(r.status not in ("not-implemented", "not-applicable")
                                        for r in self.results)


NAME_LIMIT = 200  # characters of a backend's name, version, device or dtype shown


def describe_backend(backend: Any) -> dict[str, str]:
    """The backend's name, version, device and dtype as a report shows them (escaped)."""
    return {k: shown(_read(backend, k, "?"), NAME_LIMIT)
            for k in ("name", "version", "device", "dtype")}


def judged_precision(backend: Any, asked: str | None,
                     declared: str | None = None) -> tuple[Precision, str]:
    """The precision a run judges (the dtype asked, else the backend's own) and, when the
    backend declares another dtype than the one asked (a factory that ignores ``dtype``),
    the error every check of the run reports: its results say nothing about ``asked``.
    ``declared``: the dtype as the run's header read it (read once: a property that
    answers differently each time must not be judged by one dtype and shown as another)."""
    declared = (declared or _read(backend, "dtype", "float64")).replace("torch.", "")
    if asked is None or asked == declared:
        return Precision.of(declared), ""
    return Precision.of(asked), (f"the backend declares dtype {shown(declared, NAME_LIMIT)}, "
                                 f"not the {asked} asked (does it take a dtype argument?)")


def device_mismatch(backend: Any, asked: str | None) -> str:
    """The error every check reports when the backend declares another device than the one
    asked (a factory that ignores ``device``), else "". "cuda" and "cuda:N" name the same."""
    declared = _read(backend, "device", "?")
    if asked is None or asked == declared or declared.split(":")[0] == asked \
            or asked.split(":")[0] == declared:
        return ""
    return (f"the backend declares device {shown(declared, NAME_LIMIT)}, not the "
            f"{shown(asked, NAME_LIMIT)} asked (does it take a device argument?)")


def dtype_error(check: Check, detail: str) -> CheckResult:
    return CheckResult(check.id, list(check.entries), check.kind, "error", None, detail,
                       0, 0, 0.0, check.budget)


def _read(backend: Any, attribute: str, default: str) -> str:
    """str(backend.attribute), or ``default`` where reading it raises (a backend's
    property or __getattr__ may raise anything)."""
    try:
        return str(getattr(backend, attribute, default))
    except (Exception, SystemExit):  # noqa: BLE001 — SystemExit(0) ended the run, status 0
        return default


def _missing_ops(backend: Any, check: Check) -> list[str]:
    def usable(op: str) -> bool:
        try:
            return callable(getattr(backend, op, None))
        except (Exception, SystemExit):  # noqa: BLE001 — a __getattr__ that raises has no
            return False  # such operation (its SystemExit(0) ended the run with status 0)

    return [op for op in check.ops if not usable(op)]


def capability_mismatch(backend: Any) -> str:
    """The error every check reports when the backend's ``capabilities`` is not a set of
    known areas (discovery refuses such a backend; a backend object handed to run_suite
    is read here), else ""."""
    try:
        declared = getattr(backend, "capabilities", None)
    except (Exception, SystemExit) as err:  # noqa: BLE001 — a raising property
        return f"reading the backend's capabilities raised {_one_line(err)}"
    return "" if declared is None else capability_problem(declared)


def unmet(backend: Any, check: Check) -> str:
    """Why ``check`` is not implemented by ``backend``, or "" (it runs): an area the backend
    does not declare among its capabilities, or an operation it lacks."""
    declared = declared_capabilities(backend)
    if declared is not None:
        absent = [c for c in check.needs if c not in declared]
        if absent:
            return (f"backend does not implement the {' and '.join(absent)} area"
                    f"{'s' if len(absent) > 1 else ''} (it declares "
                    f"{', '.join(sorted(declared))})")
    missing = _missing_ops(backend, check)
    return f"backend has no operation {', '.join(missing)}" if missing else ""


def _first(err: BaseException) -> BaseException:
    """Hypothesis raises a group when it finds several distinct failures."""
    while isinstance(err, BaseExceptionGroup) and err.exceptions:
        err = err.exceptions[0]
    return err


def _stop_within(err: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM (a KeyboardInterrupt) behind an error, if any: a stop that
    lands inside Hypothesis's own bookkeeping can surface as one of its internal errors
    (an AssertionError raised while the stop was being handled, with the stop as its
    context), and must still stop the run, not be reported as the check's error."""
    seen: set[int] = set()
    todo = [err]
    while todo:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, KeyboardInterrupt):
            return e
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
    return None


def _stop_arrived(before: int) -> bool:
    """Whether a stop signal arrived since STOPS_RECEIVED held ``before``; where they are
    not counted (off the main thread: _noting_stops), every KeyboardInterrupt is one."""
    return (threading.current_thread() is not threading.main_thread()
            or len(STOPS_RECEIVED) > before)


def _one_line(err: BaseException) -> str:
    try:
        text = str(err).strip().splitlines()
    except BaseException:  # noqa: BLE001 — a backend's exception whose __str__ raises
        # anything: its SystemExit(0) ended the run with status 0 and no verdict
        # (--no-isolate), its KeyboardInterrupt stopped the run as if Ctrl-C was pressed
        text = ["(its message cannot be printed: its __str__ raised)"]
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Any:
    usable = (seconds is not None and seconds > 0 and hasattr(signal, "setitimer")
              and threading.current_thread() is threading.main_thread())
    if not usable:
        yield
        return

    armed = [True]

    def expire(signum: int, frame: Any) -> None:
        if armed[0]:
            raise CheckTimeout(f"timed out after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    try:  # armed inside the try: a limit so short that it fires at once is still cleared
        # fires again every second until cleared, should anything swallow the first one
        signal.setitimer(signal.ITIMER_REAL, float(seconds), 1.0)  # type: ignore[arg-type]
        yield
    finally:
        # a repeat that fires while this runs would leave the timer armed for the rest of
        # the process (and end it, once Python resets the handler at exit): disarm first
        while True:
            try:
                armed[0] = False
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
                break
            except CheckTimeout:
                continue


@contextlib.contextmanager
def _noting_stops() -> Iterator[None]:
    """Count each Ctrl-C, SIGTERM or SIGHUP that arrives (context.STOPS_RECEIVED) and pass
    it on to the handler that was there (Python's, the command's, pytest's): the command
    raises each as a stop, which must not be taken for the backend's own interrupt."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stops = (signal.SIGINT, signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else []))
    # (one ignored, as SIGHUP under nohup, stays ignored and uncounted)
    previous: dict[int, Any] = {s: h for s in stops if (h := signal.getsignal(s)) != signal.SIG_IGN}

    def note(signum: int, frame: Any) -> Any:
        STOPS_RECEIVED.append(signum)
        handler = previous[signum]
        if callable(handler):
            return handler(signum, frame)
        if handler == signal.SIG_DFL:  # what the signal would have done: end the process
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        return None

    for signum in previous:
        signal.signal(signum, note)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


# how an adjudication builds the plain implementation (its target, the dtype) and ends it
PlainBuilder = Callable[[str, str], AbstractContextManager[Any]]


def run_check(check: Check, backend: Any, precision: Precision, profile: str,
              seed: int, timeout: float | None = None, save_failures: str | None = None,
              origin: dict[str, Any] | None = None, plain: str | None = None,
              dtype_asked: bool = True, within: float | None = None,
              build_plain: PlainBuilder | None = None) -> CheckResult:
    """Run one check; never raises (except KeyboardInterrupt). On a failed comparison the
    example's exact inputs are saved under ``save_failures`` (see reproduction), and a
    low-precision failure is adjudicated against ``plain``, the target (module:attr or an
    installed name) of a plain same-dtype implementation (None: not adjudicated), built
    by ``build_plain`` (default: in this process; isolation builds it in a worker);
    ``dtype_asked``: whether the run was asked for
    ``precision``'s dtype (else it judges the one the backend declared). ``within``: the
    seconds the whole check has, its adjudication included (default ``timeout``; a worker
    gets the limit its judge stops it at): an adjudication that would pass it is cut, and
    the failure keeps its verdict."""
    within = timeout if within is None else within
    recording = RecordingBackend(backend, precision.dtype, dtype_asked)
    ctx = CheckContext(recording, precision, suite_settings(profile), seed)
    start = time.perf_counter()
    status, detail = "pass", ""
    stops = len(STOPS_RECEIVED)
    try:  # the judge's arithmetic under NumPy's default error state, whatever the backend set
        with keeping_cwd(), _noting_stops(), time_limit(timeout), \
                np.errstate(divide="warn", over="warn", under="ignore", invalid="warn"):
            check.fn(recording, ctx)
    except BaseException as raised:  # noqa: BLE001 — a backend may raise anything
        stop = _stop_within(raised)
        if stop is not None and _stop_arrived(stops):
            if stop is raised:
                raise
            raise stop from None
        # A KeyboardInterrupt no signal caused, raised where the judge used what the
        # backend returned (an __array__ or __float__, an exception's __str__): the
        # backend's error, not the user's Ctrl-C (it ended the run as "interrupted")
        err = stop if stop is not None else _first(raised)
        if isinstance(err, (CheckTimeout, WorkerLost)) \
                or isinstance(raised, (CheckTimeout, WorkerLost)):
            status, detail = "error", str(err if isinstance(err, (CheckTimeout, WorkerLost))
                                          else raised)
        elif isinstance(err, WrongDtype) or isinstance(raised, WrongDtype):
            status, detail = "error", str(err if isinstance(err, WrongDtype) else raised)
        elif isinstance(err, NotImplementedOp):
            status, detail = "not-implemented", f"backend has no operation {err}"
        elif isinstance(err, NotApplicable) or (
                isinstance(err, hypothesis.errors.Unsatisfiable) and ctx.not_applicable):
            # every example was one the backend cannot express
            status = "not-applicable"
            detail = shown(err) if isinstance(err, NotApplicable) else ctx.not_applicable_reason
        elif isinstance(err, CheckFailure):
            status, detail = "fail", str(err)
        else:
            status = "error"
            # where it was raised: in the backend's worker (isolated), or in this process
            at = getattr(err, "backend_frame", None) if type(err).__module__ in (
                "backend", "builtins") else None
            if at is None:
                where = traceback.extract_tb(err.__traceback__)
                frame = where[-1] if where else None
                at = f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}" if frame else ""
            at = f" (at {at})" if at else ""
            unsent = (" with no Ctrl-C, SIGTERM or SIGHUP received"
                      if isinstance(err, KeyboardInterrupt) else "")
            detail = f"raised {_one_line(err)}{unsent}{at}"
    worst: float | None = ctx.worst if ctx.comparisons else None
    if status == "pass" and worst is not None and not worst <= 1.0:
        # no comparison past its budget passes: something in this process swallowed it
        status, detail = "error", (f"a pass at {100 * worst:.3g}% of budget: the backend "
                                   "changed the judge's verdict in its process, and no "
                                   "check of this run can be trusted")
    if status == "pass":
        detail = ctx.worst_detail
        if ctx.not_applicable:
            detail += (f" ({ctx.not_applicable} examples not applicable, e.g. "
                       f"{ctx.not_applicable_reason})")
    result = CheckResult(
        id=check.id, entries=list(check.entries), kind=check.kind, status=status,
        worst_fraction=worst, detail=detail, examples=ctx.examples,
        comparisons=ctx.comparisons, seconds=time.perf_counter() - start,
        budget=check.budget, minimal_example="\n".join(ctx.falsifying).strip(),
        not_applicable=ctx.not_applicable)
    if status == "fail" and ctx.failure is not None:
        stops = len(STOPS_RECEIVED)
        # what is left of the check's limit, less a margin for saving and answering
        left = None if within is None else (
            within - (time.perf_counter() - start) - min(2.0, within / 10))
        try:
            with keeping_cwd(), _noting_stops():  # adjudication calls the backend again
                _after_failure(result, ctx, backend, precision, save_failures, origin, plain,
                               left, build_plain)
        except KeyboardInterrupt:
            if _stop_arrived(stops):
                raise
            result.adjudication = {"note": "adjudication failed: the backend raised "
                                           "KeyboardInterrupt with no Ctrl-C, SIGTERM or "
                                           "SIGHUP received"}
    return result


def _after_failure(result: CheckResult, ctx: CheckContext, backend: Any, precision: Precision,
                   save_failures: str | None, origin: dict[str, Any] | None,
                   plain: str | None, left: float | None = None,
                   build_plain: PlainBuilder | None = None) -> None:
    from gptspec.conformance import reproduction

    assert ctx.failure is not None
    try:
        if left is not None and left <= 0:
            if reproduction.adjudicable(ctx.failure, precision.dtype, plain):
                result.adjudication = {"note": "not adjudicated: the check used its time "
                                               "limit"}
        else:  # a plain implementation that hangs cost the failure its verdict
            with time_limit(left):
                result.adjudication = reproduction.adjudicate(ctx.failure, backend,
                                                              precision.dtype, plain,
                                                              build_plain)
    except CheckTimeout:
        result.adjudication = {"note": f"adjudication stopped: {plain} did not answer "
                                       "within the check's time limit"}
    except (Exception, SystemExit) as err:  # noqa: BLE001 — adjudication is advice; never
        # lose the result (the backend's SystemExit(0) there ended the run with status 0)
        result.adjudication = {"note": f"adjudication failed: {_one_line(err)}"}
    if save_failures:
        where = dict(origin or describe_backend(backend))
        if "name" not in where:  # (no call of the backend's while saving: it may hang)
            where["name"] = _read(backend, "name", "backend")
        try:
            result.saved = reproduction.save_failure(save_failures, result.id, result.entries,
                                                     ctx.failure, where)
        except Exception as err:  # noqa: BLE001
            result.detail += f" (could not save the example: {type(err).__name__}: {err})"


OUTPUT_LINE_LIMIT = 500  # characters of one line a backend prints, as relayed
OUTPUT_LINES_SHOWN = 200  # lines relayed after one check; the rest are counted


def relay_backend_output(data: bytes, file: Any = None, unread: int = 0) -> None:
    """What a backend printed, to the judge's standard error (``file``): each line escaped
    and marked as the backend's, so that it can neither drive the terminal nor pass for
    one of the judge's verdict lines. ``unread``: bytes printed after ``data``, not read."""
    file = file or sys.stderr
    lines = data.splitlines()
    for raw in lines[:OUTPUT_LINES_SHOWN]:
        text = shown(raw.decode("utf-8", "replace"), OUTPUT_LINE_LIMIT)
        print(f"  backend output: {text}", file=file)
    if len(lines) > OUTPUT_LINES_SHOWN:
        print(f"  backend output: … {len(lines) - OUTPUT_LINES_SHOWN} more lines",
              file=file)
    if unread:
        print(f"  backend output: … and {unread} more bytes, not shown", file=file)


_RELAYING: dict[str, Any] = {}  # while the backend's output goes aside (see _Routed)
_RELAY_LOCK = threading.Lock()  # the watchdog's thread may end the relaying too


def _flush_streams(*streams: Any) -> None:
    for stream in streams or (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


class _Routed:
    """``sys.stdout`` or ``sys.stderr`` while the backend's output goes aside: the judge's
    threads write to the judge's stream; any other thread, and the judge's own thread
    while it runs the backend's code, into the file relayed later. By thread, because a
    thread the backend left running wrote raw, between and after the verdict lines."""

    def __init__(self, judge: Any, backend: Any, fd: int) -> None:
        self._judge, self._backend, self._fd = judge, backend, fd

    def _target(self) -> Any:
        me = threading.current_thread()  # not its ident: a later thread may reuse that
        judges = _RELAYING.get("judges", ())
        if me in judges and not (me == judges[0] and _RELAYING.get("in_backend")):
            return self._judge
        if getattr(self._backend, "closed", False):  # the backend's close() closed its own
            self._backend = _line_stream(self._fd)
        return self._backend

    @property
    def closed(self) -> bool:  # the judge's: the checks restore a stream the backend closed
        return bool(getattr(self._judge, "closed", False))

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target(), name)


def _line_stream(fd: int, encoding: str = "utf-8", errors: str = "backslashreplace") -> Any:
    """A line-buffered text stream on descriptor ``fd``, which it never closes."""
    return open(fd, "w", encoding=encoding, errors=errors, buffering=1, closefd=False)


def _stream_on(stream: Any, fd: int) -> bool:
    try:
        return stream.fileno() == fd
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation: capsys's
        return False


def route_backend_output(whole_run: bool = True) -> None:
    """From now on what the backend writes to descriptors 1 and 2, or to ``sys.stdout``
    and ``sys.stderr`` from any thread but this one (and the watchdog's, :func:`judge_thread`),
    goes into a file of its own, relayed escaped by :func:`backend_output_relayed` and at
    :func:`end_routing`. ``whole_run``: until end_routing (else: the relayed block's)."""
    _flush_streams()
    fd, path = tempfile.mkstemp(prefix="gptspec-backend-output-")
    try:
        reader = open(path, "rb")  # its own offset: the writers append
        os.close(fd)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    finally:
        os.unlink(path)
    with _RELAY_LOCK:
        if _RELAYING:
            os.close(fd)
            reader.close()
            raise RuntimeError("backend output is already being relayed")
        saved: list[int] = []
        try:
            saved += [os.dup(1), os.dup(2)]
            os.dup2(fd, 1)
            os.dup2(fd, 2)
        except OSError:
            for i, kept in enumerate(saved):
                os.dup2(kept, i + 1)
                os.close(kept)
            reader.close()
            raise
        finally:
            os.close(fd)
        streams = (sys.stdout, sys.stderr)
        routed = []
        for number, (stream, kept) in enumerate(zip(streams, saved, strict=True), start=1):
            encoding = getattr(stream, "encoding", None) or "utf-8"
            judge: Any
            backend: Any
            if _stream_on(stream, number):  # the judge's now writes where fd 1 (2) was
                judge = _line_stream(kept, encoding,
                                     getattr(stream, "errors", None) or "backslashreplace")
                backend = stream
            else:  # a stream of its own (pytest's capsys): the backend's is a new one
                judge = stream
                backend = _line_stream(number, encoding)
            routed.append(_Routed(judge, backend, number))
        _RELAYING.update(out=saved[0], err=saved[1], reader=reader, streams=streams,
                         routed=routed, whole_run=whole_run, in_backend=False,
                         judges=(threading.current_thread(),))
        sys.stdout, sys.stderr = routed  # type: ignore[assignment]


def judge_thread() -> None:
    """The calling thread writes the judge's lines (the watchdog's), not the backend's."""
    with _RELAY_LOCK:
        if _RELAYING:
            _RELAYING["judges"] += (threading.current_thread(),)


def _take_printed() -> tuple[bytes, Any]:
    """What the backend printed since the last look, and the judge's standard error."""
    for routed in _RELAYING["routed"]:
        _flush_streams(routed._backend)
    printed = _RELAYING["reader"].read()
    return printed, _RELAYING["routed"][1]._judge


def end_routing(keep_aside: bool = False) -> None:
    """What the backend printed since the last look relayed, and the judge's standard
    output and error back in place; ``keep_aside``: threads the backend left are still
    running, so descriptors 1 and 2 stay theirs, on /dev/null, until the process ends."""
    with _RELAY_LOCK:
        if not _RELAYING:
            return
        printed, err = _take_printed()
        _RELAYING["reader"].close()
        if keep_aside:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            os.close(devnull)
            _RELAYING.update(in_backend=False, reader=open(os.devnull, "rb"))
        else:
            state = dict(_RELAYING)
            _RELAYING.clear()
            for routed in state["routed"]:
                _flush_streams(routed._judge)
            sys.stdout, sys.stderr = (  # one the backend closed: open again on its fd
                _line_stream(fd, getattr(stream, "encoding", None) or "utf-8")
                if getattr(stream, "closed", False) else stream
                for fd, stream in enumerate(state["streams"], start=1))
            os.dup2(state["out"], 1)
            os.dup2(state["err"], 2)
            os.close(state["out"])
            os.close(state["err"])
            err = sys.stderr
    relay_backend_output(printed, err)


@contextlib.contextmanager
def backend_output_relayed() -> Iterator[None]:
    """A backend run in the judge's process prints (Python's and C code's alike) into a
    file of its own, relayed when its code returns: raw, its lines could forge verdicts
    and drive the terminal (``--no-isolate``; isolated, the worker's output is relayed)."""
    if not _RELAYING:
        route_backend_output(whole_run=False)
    with _RELAY_LOCK:
        if _RELAYING.get("in_backend"):
            raise RuntimeError("backend output is already being relayed")
        _flush_streams(*(routed._judge for routed in _RELAYING["routed"]))
        _RELAYING["in_backend"] = True
    try:
        yield
    finally:
        stop_relaying()


def stop_relaying() -> None:
    """The judge's own standard output and error back in place, and what the backend
    printed meanwhile relayed (the watchdog calls it too, when a check overruns)."""
    with _RELAY_LOCK:
        if not _RELAYING or not _RELAYING["in_backend"]:
            return
        _RELAYING["in_backend"] = False
        whole_run = _RELAYING["whole_run"]
        if whole_run:
            printed, err = _take_printed()
    if whole_run:
        relay_backend_output(printed, err)
    else:
        end_routing()


def run_suite(backend: Any, *, profile: str = "default", seed: int = 0,
              select: Callable[[Check], bool] | None = None, area: str | None = "forward",
              reproduce: str = "", on_result: Callable[[CheckResult], None] | None = None,
              header: Callable[[SuiteResult], None] | None = None,
              stop_on_failure: bool = False, timeout: float | None = None,
              save_failures: str | None = None,
              origin: dict[str, Any] | None = None, plain: str | None = None,
              dtype: str | None = None, device: str | None = None,
              relay_output: bool = False) -> SuiteResult:
    """Run every selected check against ``backend``, dependencies first. A check whose
    dependency failed is reported as blocked by the root cause, not run. ``timeout``:
    seconds per check; ``save_failures``: a directory for failing examples (``origin``
    names the backend's target, device and dtype for the reproducing test); ``plain``: the
    backend target (as discovery reads it) a low-precision failure is adjudicated against,
    or None; ``dtype``, ``device``: what was asked, which the backend must declare (and
    compute in; None: the backend's own); ``relay_output``: what the backend prints is
    relayed, escaped (:func:`backend_output_relayed`)."""
    # the judge's reads of the backend (its name, dtype, operations) run its code too
    relayed = backend_output_relayed if relay_output else contextlib.nullcontext
    with relayed():
        described = describe_backend(backend)
    suite = SuiteResult(described,
                        suite_settings_dict(profile, seed, area, timeout, isolated=False))
    if header:
        header(suite)
    with relayed():
        evaluate, unimplemented = judge(backend, profile=profile, seed=seed,
                                        timeout=timeout, save_failures=save_failures,
                                        origin=origin, plain=plain, dtype=dtype,
                                        device=device, declared=described["dtype"])
    if relay_output:
        judged, looked_up = evaluate, unimplemented

        def evaluate(check: Check) -> CheckResult:
            with backend_output_relayed():
                return judged(check)

        def unimplemented(check: Check) -> str:
            with backend_output_relayed():
                return looked_up(check)

    # every stop signal of the run counted, not only those within a check's own count: one
    # that landed while a look-up swapped the handlers was taken for the backend's
    # KeyboardInterrupt, and the run went on to its end
    with _noting_stops():
        for result in walk(all_checks(area), select, evaluate, reproduce, seed,
                           unimplemented):
            suite.results.append(result)
            if on_result:
                on_result(result)
            if stop_on_failure and result.status in ("fail", "error"):
                break
    return suite


def judge(backend: Any, *, profile: str, seed: int, timeout: float | None = None,
          save_failures: str | None = None, origin: dict[str, Any] | None = None,
          plain: str | None = None, dtype: str | None = None, device: str | None = None,
          declared: str | None = None
          ) -> tuple[Callable[[Check], CheckResult], Callable[[Check], str]]:
    """The ``evaluate`` and ``unimplemented`` that :func:`walk` takes for ``backend`` (see
    run_suite for the arguments; ``declared``: its dtype as already read, judged_precision):
    run_suite and the pytest plugin judge a check alike."""
    precision, mismatch = judged_precision(backend, dtype, declared)
    mismatch = mismatch or device_mismatch(backend, device) or capability_mismatch(backend)

    def reading(check: Check) -> str | None:
        """unmet(backend, check), or None where the backend's __getattr__ raised a
        KeyboardInterrupt no stop signal sent (with --no-isolate it ended the run as
        "interrupted")."""
        stops = len(STOPS_RECEIVED)
        try:
            with _noting_stops():
                return unmet(backend, check)
        except KeyboardInterrupt:
            if _stop_arrived(stops):
                raise
            return None

    def evaluate(check: Check) -> CheckResult:
        if mismatch:
            return dtype_error(check, mismatch)
        why = reading(check)
        if why is None:
            return dtype_error(check, "reading the backend's operations raised "
                                      "KeyboardInterrupt with no Ctrl-C, SIGTERM or SIGHUP "
                                      "received")
        if why:
            return not_implemented(check, [], why)
        return run_check(check, backend, precision, profile, seed, timeout, save_failures,
                         origin, plain, dtype is not None)

    def unimplemented(check: Check) -> str:
        return "" if mismatch else (reading(check) or "")

    return evaluate, unimplemented


def start_backend(target: str, *, device: str | None, dtype: str | None,
                  timeout: float | None, flag: str = "--timeout") -> tuple[Any, dict[str, Any]]:
    """(backend, origin) of ``target`` built in this process, bounded like a check: its
    import or constructor may hang (``flag`` names the time limit in the error) or move
    the working directory. Raises discovery's BackendError or BackendRefused."""
    from gptspec.conformance.discovery import BackendError, load_backend

    stops = len(STOPS_RECEIVED)
    try:
        with keeping_cwd(), _noting_stops(), time_limit(timeout):
            backend = load_backend(target, device=device, dtype=dtype)
            origin = {"spec": target, "device": device or str(backend.device),
                      "dtype": dtype or str(backend.dtype),
                      "name": _read(backend, "name", target)}
    except CheckTimeout:
        raise BackendError(f"backend {target!r} did not start within {timeout:g} s ({flag})"
                           ) from None
    except (KeyboardInterrupt, SystemExit) as err:
        # raised where the judge read the backend (its name's __str__, its exception's
        # message): SystemExit(0) ended the run with status 0 and no verdict, a
        # KeyboardInterrupt no signal sent as "interrupted"
        if isinstance(err, KeyboardInterrupt) and _stop_arrived(stops):
            raise
        raise BackendError(f"backend {target!r} failed to start: reading it raised "
                           f"{type(err).__name__}" + (" with no Ctrl-C, SIGTERM or SIGHUP "
                           "received" if isinstance(err, KeyboardInterrupt) else "")) from None
    return backend, origin


def suite_settings_dict(profile: str, seed: int, area: str | None, timeout: float | None,
                        isolated: bool) -> dict[str, Any]:
    return {"profile": profile, "seed": seed, "area": area or "all",
            "examples_per_property": suite_settings(profile).max_examples,
            "timeout_s": timeout, "isolated": isolated}


def not_implemented(check: Check, missing: list[str], why: str = "") -> CheckResult:
    """``why``: the reason (unmet's), else the operations ``missing``."""
    return CheckResult(check.id, list(check.entries), check.kind, "not-implemented", None,
                       why or f"backend has no operation {', '.join(missing)}", 0, 0, 0.0,
                       check.budget)


def reproduce_command(target: str, profile: str, area: str, dtype: str | None = None,
                      device: str | None = None) -> str:
    """The ``gptspec conformance`` command that reruns a run's failures (``walk`` adds each
    failure's ``--check`` and ``--seed``): the CLI and the pytest plugin print the same."""
    command = ["gptspec", "conformance", "--backend", target, "--profile", profile, "--area", area]
    command += ["--dtype", dtype] if dtype else []
    command += ["--device", device] if device else []
    return shlex.join(command)


def walk(checks: list[Check], select: Callable[[Check], bool] | None,
         evaluate: Callable[[Check], CheckResult], reproduce: str, seed: int,
         unimplemented: Callable[[Check], str] | None = None,
         known: dict[str, CheckResult] | None = None) -> Any:
    """Yield each selected check's result in order: blocked by a failed dependency's root
    cause, or ``evaluate(check)``. A check the backend does not implement at all
    (``unimplemented`` gives why) is reported so even when a dependency failed: blocked
    counts only checks that a failure kept from running. ``known``: results so far, by
    id, which the walk reads and adds to (the pytest plugin keeps one per process)."""
    by_id: dict[str, CheckResult] = {} if known is None else known
    for check in checks:
        if select is not None and not select(check):
            continue
        root = _root_cause(check, by_id)
        why = unimplemented(check) if root and unimplemented is not None else ""
        if why:
            result = not_implemented(check, [], why)
        elif root:
            result = CheckResult(check.id, list(check.entries), check.kind, "blocked", None,
                                 f"blocked by {root}, which failed", 0, 0, 0.0, check.budget,
                                 blocked_by=root)
        else:
            result = evaluate(check)
            if result.status in ("fail", "error") and reproduce:
                result.reproduce = f"{reproduce} --check {check.id} --seed {seed}"
        by_id[check.id] = _escaped(result)
        yield result


def _escaped(result: CheckResult) -> CheckResult:
    """``result`` with every text a backend may have written (an exception's message,
    an example's repr, an adjudication's note) as :func:`shown` prints it: a terminal
    and a report get the same escaped, bounded text."""
    result.detail = shown(result.detail)
    result.minimal_example = shown(result.minimal_example, 4 * SHOWN_LIMIT, lines=True)
    result.saved = [shown(path) for path in result.saved]
    if result.adjudication is not None:
        result.adjudication = {k: shown(v) if isinstance(v, str) else v
                               for k, v in result.adjudication.items()}
    return result


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
