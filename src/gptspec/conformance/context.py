"""What a check runs in: the Hypothesis settings of the run, and the record of its
comparisons (the worst fraction of budget, and the example that produced it).

Capturing a failing example's exact inputs: the check sees the backend through a
:class:`RecordingBackend`, which keeps the calls of the current example (operation or
``forward``, its arguments and its result), and each comparison carries its arrays
(``Comparison.arrays``). When a comparison fails, the context saves both as a
:class:`FailureCapture`; Hypothesis replays the minimal example
last, so the capture left at the end is the minimal one. ``reproduction`` writes it as an
``.npz`` and a pytest file.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis
import numpy as np
from hypothesis import HealthCheck, Phase, settings

from gptspec.conformance import budgets
from gptspec.conformance.budgets import Comparison, Precision
from gptspec.conformance.protocol import NotApplicable, capability_problem, shown
from gptspec.spec.config import GPTConfig

PROFILES = {"quick": 12, "default": 30, "thorough": 200}


class CheckFailure(AssertionError):
    """A comparison outside its budget, or a property that does not hold."""


class NotImplementedOp(Exception):
    """The backend does not provide an optional operation."""


class WrongDtype(BaseException):
    """The backend's logits are not in the dtype the run judges (a BaseException, like a
    time-out, so that Hypothesis reports it at once instead of shrinking the example)."""


def wrong_dtype(output: Any, dtype: str, asked: bool = True) -> str:
    """Why ``forward``'s output is not an array of ``dtype`` values, or "" (``asked``: the
    run was asked for ``dtype``, else it judges the dtype the backend declared). An array of a
    wider dtype holding exactly ``dtype`` values (bfloat16 logits handed back as float32)
    is fine; a Python list, or values that ``dtype`` cannot hold, were computed in another
    precision, and judging them with ``dtype``'s looser budgets would pass them unearned."""
    try:
        x = np.asarray(output)
        if x.dtype.kind == "O":  # Python objects: judged by the numbers they hold
            x = x.astype(np.float64)
    except Exception:  # noqa: BLE001 — not an array at all: the check's comparison says so
        return ""
    if x.dtype.kind == "c":  # the comparison would drop the imaginary part unseen
        return f"forward returned complex values ({x.dtype}): logits are real numbers"
    if dtype == "float64":
        return ""
    # the dtype an array holds (bfloat16: ml_dtypes'); any other object's dtype attribute
    # says nothing (one that reads as float64 values claimed bfloat16 and passed): its
    # values are checked
    declared = getattr(output, "dtype", None)
    returned = str(declared).replace("torch.", "")
    if isinstance(output, np.ndarray) and returned == dtype:
        return ""
    if not isinstance(output, np.ndarray):
        returned = str(x.dtype)  # what its values read as
    if x.dtype.kind != "f":
        return ""  # not floating-point numbers: the check itself says what is wrong
    x = x.astype(np.float64)
    why = (f"where {dtype} was asked" if asked else
           f"where the backend declared dtype {dtype} when the run began")
    if declared is None:
        return (f"forward returned a Python {type(output).__name__} (float64 values), not "
                f"an array of {dtype} values, {why}")
    finite = x[np.isfinite(x)]
    off = finite[budgets.round_to(finite, dtype) != finite]
    if not off.size:
        return ""
    return (f"forward returned {returned} values that {dtype} cannot hold (e.g. "
            f"{float(off[0])!r}) {why}: it did not compute in {dtype}")


def cache_outside_the_working_directory() -> None:
    """For the ``gptspec conformance`` command (not a library caller's choice): Hypothesis's
    cache (no examples are kept: database=None) goes under the user's cache folder, not
    into a ``.hypothesis/`` in whatever folder the command runs in (a run's checkpoint
    folder, say)."""
    import tempfile

    from hypothesis.configuration import set_hypothesis_home_dir

    xdg = os.environ.get("XDG_CACHE_HOME")
    home = os.environ.get("HOME")
    base = Path(xdg) if xdg else Path(home) / ".cache" if home else None
    for folder in ([base / "gptspec" / "hypothesis"] if base else []) + [
            Path(tempfile.gettempdir()) / f"gptspec-hypothesis-{os.getuid()}"]:
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            if os.access(folder, os.W_OK):
                set_hypothesis_home_dir(folder)
                return
        except OSError:
            continue


def suite_settings(profile: str) -> settings:
    """Hypothesis settings for a profile. Under CI the library's own ``ci`` profile
    (derandomized, no database) is the base, extended rather than replaced."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; known: {', '.join(PROFILES)}")
    base = settings.get_profile("ci") if os.environ.get("CI") else settings()
    return settings(
        base,
        max_examples=PROFILES[profile],
        # Not the explain phase: the lines it reports as "always and only run by failing
        # examples" are the suite's own comparison code (budgets.compare, ctx.record),
        # which says nothing about the backend; the failure message names the comparison.
        phases=tuple(phase for phase in base.phases if phase is not Phase.explain),
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.filter_too_much],
    )


@dataclass
class Call:
    """One call a check made to the backend."""

    name: str  # "forward" or the operation's name
    args: tuple
    kwargs: dict
    output: Any = None


@dataclass
class FailureCapture:
    """The exact inputs and arrays of a failing comparison (the minimal example's)."""

    what: str
    message: str
    calls: list[Call]
    actual: Any = None
    expected: Any = None
    bound: Any = None
    comparison: Comparison | None = None


_SKIP = {"name", "version", "device", "dtype"}
_KEEP_CALLS = 16  # calls kept per example (a check makes a handful)


@contextlib.contextmanager
def keeping_cwd() -> Any:
    """The working directory and umask as they were before a backend ran in this process:
    a backend's ``os.chdir`` must not move the files the judge writes (reports, saved
    failures), nor its ``os.umask(0o777)`` make them unreadable; its
    ``sys.setrecursionlimit(30)`` or emptied ``sys.path`` broke the judge after the check
    (a RecursionError or ModuleNotFoundError ended the run); nor its ``signal.signal(SIGINT,
    SIG_IGN)`` make the user's Ctrl-C, SIGTERM or SIGHUP do nothing for the rest of the run;
    nor its ``sys.setprofile`` hook print verdict lines from within the judge's own calls,
    nor its lowered ``RLIMIT_FSIZE`` or ``RLIMIT_NOFILE`` keep the reports from being written."""
    umask = os.umask(0o022)
    os.umask(umask)
    interpreter = (sys.getrecursionlimit(), list(sys.path))
    hooks = _hooks()
    limits = _limits()
    saved = _saved_fds()
    streams = (sys.stdout, sys.stderr)
    fds = (_fileno(sys.stdout), _fileno(sys.stderr))
    handlers = _stop_handlers()
    try:
        here: int | None = os.open(".", os.O_RDONLY)
    except OSError:  # no readable working directory: nothing to keep
        here = None
    try:
        yield
    finally:
        os.umask(umask)
        _restore_hooks(hooks)
        _restore_limits(limits)
        _restore_stop_handlers(handlers)
        _restore_streams(streams, fds)
        _restore_interpreter(*interpreter)
        _restore_fds(saved)
        if here is not None:
            try:
                os.fchdir(here)
            finally:
                os.close(here)


def _hooks() -> tuple[Any, ...]:
    return (sys.gettrace(), sys.getprofile(), threading.gettrace(), threading.getprofile())


def _restore_hooks(hooks: tuple[Any, ...]) -> None:
    if _hooks() != hooks:  # as they were: a debugger's or coverage's stay
        sys.settrace(hooks[0])
        sys.setprofile(hooks[1])
        threading.settrace(hooks[2])
        threading.setprofile(hooks[3])


def _limits() -> dict[int, tuple[int, int]]:
    """The soft and hard limits a backend may lower, on the files the judge then writes
    and the memory it computes in."""
    try:
        import resource
    except ImportError:  # not Unix
        return {}
    names = ("RLIMIT_FSIZE", "RLIMIT_NOFILE", "RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_CPU")
    kinds = [getattr(resource, n) for n in names if hasattr(resource, n)]
    return {kind: resource.getrlimit(kind) for kind in kinds}


def _restore_limits(limits: dict[int, tuple[int, int]]) -> None:
    import resource

    def lower(a: int, b: int) -> bool:  # a below b, RLIM_INFINITY above all
        return a != b and (b == resource.RLIM_INFINITY
                           or (a != resource.RLIM_INFINITY and a < b))

    for kind, (soft, _) in limits.items():
        now_soft, now_hard = resource.getrlimit(kind)
        # only a lowered soft limit is raised again: one the backend raised (more files
        # for its weights' shards) it may still need, and it keeps the judge from nothing
        if lower(now_soft, soft):
            with contextlib.suppress(ValueError, OSError):  # a hard limit lowered: for good
                resource.setrlimit(kind, (soft if not lower(now_hard, soft) else now_hard,
                                          now_hard))


def _stop_handlers() -> dict[int, Any]:
    """The handlers of the stop signals, where this thread may set them (the main one)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    names = ("SIGINT", "SIGTERM", "SIGHUP")
    return {s: signal.getsignal(s) for s in (getattr(signal, n, None) for n in names)
            if s is not None}


def _restore_stop_handlers(handlers: dict[int, Any]) -> None:
    for signum, handler in handlers.items():
        if handler is not None and signal.getsignal(signum) is not handler:
            with contextlib.suppress(ValueError, OSError, TypeError):
                signal.signal(signum, handler)


def _saved_fds() -> dict[int, int]:
    """Copies of descriptors 1 and 2: a backend's ``os.dup2`` of /dev/null onto them, or
    its ``os.close(1)``, lost every verdict line after it (--no-isolate)."""
    saved = {}
    for fd in (1, 2):
        with contextlib.suppress(OSError):
            saved[fd] = os.dup(fd)
    return saved


def _restore_fds(saved: dict[int, int]) -> None:
    for fd, copy in saved.items():
        with contextlib.suppress(OSError):
            os.dup2(copy, fd)
        os.close(copy)


def _restore_interpreter(limit: int, path: list[str]) -> None:
    sys.setrecursionlimit(limit)
    if not isinstance(sys.path, list):  # a backend may rebind it, not only empty it
        sys.path = []
    sys.path[:] = path


def _restore_streams(streams: tuple[Any, Any], fds: tuple[int | None, int | None]) -> None:
    """``sys.stdout`` and ``sys.stderr`` as they were (a backend may replace or close them:
    the judge's verdict lines went after them); a closed one is opened again on its file
    descriptor."""
    for name, stream, fd in zip(("stdout", "stderr"), streams, fds, strict=True):
        if getattr(stream, "closed", False) and fd is not None:
            try:
                stream = open(fd, "w", encoding=stream.encoding, errors=stream.errors,
                              buffering=1, closefd=False)
            except (OSError, ValueError, AttributeError, TypeError):
                continue
        setattr(sys, name, stream)


def _fileno(stream: Any) -> int | None:
    try:
        return int(stream.fileno())
    except Exception:  # noqa: BLE001 — a stream without a descriptor (captured output)
        return None


# The stop signals (Ctrl-C, SIGTERM, SIGHUP) this process received while a check ran (the runner
# counts them): a KeyboardInterrupt that none of them raised is the backend's own.
STOPS_RECEIVED: list[int] = []


class BackendInterrupt(Exception):
    """A backend raised KeyboardInterrupt with no stop signal received: its error."""


class BackendSteered(Exception):
    """A backend raised what steers the test framework (Hypothesis's ``assume``/``reject``,
    its stop and freeze signals, a test runner's skip): its error, never an example
    rejected or skipped (rejecting the examples it got wrong made a wrong backend pass)."""


_FRAMEWORKS = ("hypothesis", "_pytest", "pytest", "unittest")


def _from_a_framework(err: BaseException) -> bool:
    """Whether ``err`` is (or derives from) an exception of a test framework's modules."""
    return any((kind.__module__ or "").split(".")[0] in _FRAMEWORKS
               for kind in type(err).__mro__)


@contextlib.contextmanager
def steering_refused(name: str) -> Any:
    """Run the backend's ``name``; what it raises from a test framework's own modules (a
    KeyboardInterrupt aside) becomes BackendSteered."""
    try:
        yield
    except KeyboardInterrupt:
        raise
    except BaseException as err:
        if not _from_a_framework(err):
            raise
        raise BackendSteered(
            f"{name} raised {type(err).__module__}.{type(err).__qualname__}: a backend "
            "cannot reject, skip or stop the judge's examples (its error)") from None


@contextlib.contextmanager
def backend_call(name: str) -> Any:
    """Around every call of a backend's code in the judge's process: the working directory,
    NumPy's error state and the warning filters as the call found them (its np.seterr stays
    in its own calls), and steering refused."""
    with keeping_cwd(), np.errstate(), warnings.catch_warnings(), steering_refused(name):
        yield


class UnreadableOutput(Exception):
    """What a backend returned cannot be read as data (nested past any sensible depth)."""


_PLAIN_DEPTH = 64  # levels of lists, tuples and dicts in a backend's result
_OBJECT_LIMIT = 1 << 22  # Python objects in an object array a backend returns


def plain_output(value: Any, name: str, depth: int = 0) -> Any:
    """What a backend's ``name`` returned, as data the judge owns: arrays as plain ndarrays
    (a subclass, a memmap, a tensor through its ``__array__``), numbers, strings
    and containers rebuilt as the exact built-in types, so that no method of the
    backend's (an ``__eq__`` that always holds, an ``__array__`` that rejects the example)
    runs inside the judge's own comparisons; any other object (a tokenizer) behind a
    Guarded proxy. Called inside steering_refused."""
    if depth > _PLAIN_DEPTH:
        raise UnreadableOutput(f"{name} returned containers nested more than "
                               f"{_PLAIN_DEPTH} levels deep")
    if value is None or type(value) in (bool, int, float, complex, str, bytes):
        return value
    if isinstance(value, Guarded):  # already the judge's (isolation.Remote)
        return value
    if isinstance(value, np.str_):  # a NumPy string is a str (decode's result, say)
        return str.__str__(value)
    if isinstance(value, np.bytes_):
        return bytes.__getitem__(value, slice(None))
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "O":  # Python objects: each one read as data too
            if value.size > _OBJECT_LIMIT:
                raise UnreadableOutput(f"{name} returned an array of {value.size} Python "
                                       "objects")
            items = [plain_output(v, name, depth + 1) for v in value.ravel().tolist()]
            return np.array(items + [None], dtype=object)[:-1].reshape(value.shape)
        # a plain view, not a copy (a broadcast view may span terabytes); the base class's
        # own method, not a subclass's
        return np.ndarray.view(value, np.ndarray)
    if isinstance(value, np.generic):
        return np.array(value, subok=False)[()]
    # subclasses of the built-in types, read through the base type's own slots
    if isinstance(value, int):  # bool cannot be subclassed
        return int.__add__(value, 0)
    if isinstance(value, float):
        return float.__mul__(value, 1.0)  # keeps −0.0 and NaN
    if isinstance(value, complex):
        return complex(float.__mul__(value.real, 1.0), float.__mul__(value.imag, 1.0))
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bytes):
        return bytes.__getitem__(value, slice(None))
    if isinstance(value, list):
        return [plain_output(list.__getitem__(value, i), name, depth + 1)
                for i in range(list.__len__(value))]
    if isinstance(value, tuple):
        return tuple(plain_output(tuple.__getitem__(value, i), name, depth + 1)
                     for i in range(tuple.__len__(value)))
    if isinstance(value, dict):
        return {plain_output(k, name, depth + 1): plain_output(v, name, depth + 1)
                for k, v in dict.items(value)}
    if any(hasattr(type(value), a) for a in ("__array__", "__array_interface__",
                                             "__array_struct__")):
        try:
            array = np.asarray(value)
        except Exception as err:  # noqa: BLE001 — a tensor NumPy cannot hold (bfloat16):
            if _from_a_framework(err):
                raise  # steering: steering_refused makes it the backend's error
            return Guarded(value, name)  # the judge's own conversion will say so
        if array.dtype.kind != "O":
            return np.ndarray.view(array, np.ndarray)
    return Guarded(value, name)


class Guarded:
    """An object a backend returned that is not data (a tokenizer, say): its methods and
    attributes are reached as the backend's operations are, steering refused and results
    read as data (plain_output)."""

    def __init__(self, wrapped: Any, name: str) -> None:
        self._wrapped = wrapped
        self._name = name

    def __getattr__(self, attribute: str) -> Any:
        name = f"{self._name}.{attribute}"
        with steering_refused(name):
            value = getattr(self._wrapped, attribute)
            if not callable(value):
                return plain_output(value, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            with backend_call(name):
                return plain_output(value(*args, **kwargs), name)

        call.__name__ = attribute
        return call

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        with steering_refused(f"{self._name}.__array__"):
            return np.ndarray.view(np.asarray(self._wrapped, dtype), np.ndarray)

    def __repr__(self) -> str:
        with steering_refused(f"{self._name}.__repr__"):
            return shown(repr(self._wrapped), 200)

    # a sequence or an iterator of results (a generator of tokens, say), read item by item
    def __len__(self) -> int:
        with steering_refused(f"len({self._name})"):
            return int.__add__(len(self._wrapped), 0)

    def __getitem__(self, key: Any) -> Any:
        with steering_refused(f"{self._name}[…]"):
            return plain_output(self._wrapped[key], self._name)

    def __iter__(self) -> Any:
        name = f"iter({self._name})"
        with steering_refused(name):
            items = iter(self._wrapped)
        while True:
            with steering_refused(name):
                try:
                    item = next(items)
                except StopIteration:
                    return
                value = plain_output(item, name)
            yield value


class RecordingBackend:
    """The backend as a check sees it: every call to an operation or ``forward`` is
    recorded, in order, in ``calls`` (reset at each example by the context); logits not
    in ``dtype`` raise WrongDtype (``asked``: the run was asked for it, else the backend
    declared it). A call leaves the judge's NumPy error state and warning filters as it
    found them, a KeyboardInterrupt no signal caused is the backend's error, and a process
    the backend forked ends when the call returns into it."""

    def __init__(self, backend: Any, dtype: str = "float64", asked: bool = True) -> None:
        self._backend = backend
        self.calls: list[Call] = []
        self._dtype = dtype  # forward's logits must be values of it (see wrong_dtype)
        self._asked = asked
        self._pid = os.getpid()

    @property
    def wrapped(self) -> Any:
        return self._backend

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._backend, name)
        if name in _SKIP or name.startswith("_") or not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            record = Call(name, args, kwargs)
            self.calls.append(record)
            del self.calls[:-_KEEP_CALLS]
            stops = len(STOPS_RECEIVED)
            try:
                with backend_call(name):
                    record.output = plain_output(value(*args, **kwargs), name)
            except KeyboardInterrupt:
                if len(STOPS_RECEIVED) > stops:
                    raise  # Ctrl-C or SIGTERM: the run stops
                interrupt = True  # raised below, outside this handler: with no context
            else:
                interrupt = False
            finally:
                if os.getpid() != self._pid:  # a fork of the backend's returned here
                    os._exit(0)
            if interrupt:
                raise BackendInterrupt(f"{name} raised KeyboardInterrupt, with no Ctrl-C "
                                       "or SIGTERM received")
            if name == "forward":
                problem = wrong_dtype(record.output, self._dtype, self._asked)
                if problem:
                    raise WrongDtype(problem)
            return record.output

        call.__name__ = name
        return call


def declared_support(backend: Any) -> Callable[[GPTConfig], str | None] | None:
    """The backend's ``supports(config)`` (why it cannot express a configuration, or None),
    seen through a RecordingBackend; None where it declares none."""
    if isinstance(backend, RecordingBackend):
        backend = backend.wrapped
    supports = getattr(backend, "supports", None)
    if not callable(supports):
        return None

    def declared(config: GPTConfig) -> str | None:
        with steering_refused("supports"):
            return supports(config)  # type: ignore[no-any-return]

    return declared


def declared_capabilities(backend: Any) -> frozenset[str] | None:
    """The areas the backend declares in ``capabilities`` (protocol.CAPABILITIES), seen
    through a RecordingBackend; None where it declares none (every area its operations
    reach, and a model). Discovery has refused a declaration that is not a set of
    known areas."""
    if isinstance(backend, RecordingBackend):
        backend = backend.wrapped
    try:
        declared = getattr(backend, "capabilities", None)
    except (Exception, SystemExit):  # noqa: BLE001 — a raising property declares nothing
        return None
    if declared is None or capability_problem(declared):
        return None
    return frozenset(declared)


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
    failure: FailureCapture | None = None
    not_applicable: int = 0  # examples skipped: the backend cannot express them
    not_applicable_reason: str = ""

    def _skip_if_not_applicable(self, drawn: dict[str, Any]) -> None:
        """Skip an example whose configuration the backend declares it cannot express
        (``supports(config)`` returns a reason), before any work is spent on it."""
        supports = declared_support(self.backend)
        if supports is None:
            return
        for value in drawn.values():
            for item in value if isinstance(value, tuple) else (value,):
                if isinstance(item, GPTConfig):
                    reason = supports(item)
                    if reason:
                        raise NotApplicable(reason)

    def _not_applicable(self, err: NotApplicable) -> None:
        self.not_applicable += 1
        self.not_applicable_reason = self.not_applicable_reason or shown(err)
        hypothesis.reject()

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
            message = f"{what}: {comparison.describe()}"
            self._capture(what, message, comparison)
            raise CheckFailure(message)

    def _capture(self, what: str, message: str, comparison: Comparison | None) -> None:
        calls = list(getattr(self.backend, "calls", []))
        actual = expected = bound = None
        if comparison is not None and comparison.arrays is not None:
            actual, expected, bound = comparison.arrays
        self.failure = FailureCapture(what, message, calls, actual, expected, bound, comparison)

    def require(self, condition: bool, message: str) -> None:
        """A property that must hold exactly."""
        self.comparisons += 1
        if not condition:
            self._capture("property", message, None)
            raise CheckFailure(message)

    def given(self, *args: Any, **kwargs: Any) -> Callable[[Callable[..., None]], None]:
        """Run the decorated property now, over Hypothesis-generated examples, with the
        run's settings and seed. Usage::

            @ctx.given(z=arrays(...))
            def _(z): ...
        """

        def run(test: Callable[..., None]) -> None:
            def counted(*a: Any, **k: Any) -> None:
                try:
                    self._skip_if_not_applicable(k)
                except NotApplicable as err:
                    self._not_applicable(err)
                self.examples += 1
                if isinstance(self.backend, RecordingBackend):
                    self.backend.calls.clear()
                try:
                    test(*a, **k)
                except NotApplicable as err:
                    self.examples -= 1
                    self._not_applicable(err)

            counted.__name__ = test.__name__
            property_ = hypothesis.given(*args, **kwargs)(counted)
            wrapped = hypothesis.seed(self.seed)(self.settings(property_))
            reports: list[object] = []
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
