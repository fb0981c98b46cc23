"""Running a backend's checks in a worker process, so that a backend that hangs or kills
the interpreter (a segfault in a kernel, ``os._exit``) cannot take the run down.

The parent walks the checks in dependency order and sends a 'spawn'ed worker, which
builds the backend from its target once, one check id at a time, answered as JSON. A
worker silent past the time limit is killed (an error "timed out after N s"); one that
dies is an error naming the exit code or signal; a fresh worker takes the next check and
the run ends with a report. The worker leads its own session, and every way out (done,
timed out, crashed, Ctrl-C) kills that process group: nothing a backend forked outlives
the run or keeps the caller's pipes open.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

from gptspec.conformance import reproduction
from gptspec.conformance.discovery import BackendError, BackendRefused
from gptspec.conformance.protocol import shown
from gptspec.conformance.registry import Check, all_checks
from gptspec.conformance.runner import (
    NAME_LIMIT,
    STATUSES,
    CheckResult,
    SuiteResult,
    not_implemented,
    relay_backend_output,
    run_check,
    suite_settings_dict,
    walk,
)
from gptspec.parent_death import die_with_parent

START_TIMEOUT = 300.0  # seconds to import and build the backend, unless --timeout says
ANSWER_LIMIT = 64 << 20  # bytes of one answer of the worker's (a verdict and its example)
# bytes of what a backend printed read per relay: what relay_backend_output can show (its
# lines of at most OUTPUT_LINE_LIMIT characters), with room; the rest is counted, not read
OUTPUT_READ_LIMIT = 1 << 20


def _print_into(path: str) -> None:
    """Point this process's standard output and error (Python's and C code's alike, and
    those of any child forked later) at the file ``path``, which the judge relays. Nothing
    the backend starts then holds the judge's own pipes."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None and hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True)


def _let_go_of_the_judges_tracker() -> None:
    """Close this worker's end of the judge's multiprocessing resource tracker: the tracker
    (a process of the judge's, writing to the judge's output) lives until every end is
    closed, so an end that a backend's escaped grandchild inherits would keep it, and the
    caller's pipes, open. A backend that needs a tracker gets its own."""
    from multiprocessing import resource_tracker

    tracker = getattr(resource_tracker, "_resource_tracker", None)
    fd = getattr(tracker, "_fd", None)
    if tracker is not None and fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
        tracker._fd = None
        tracker._pid = None


# the modules whose functions a verdict passes through, up to the bytes sent to the judge
_JUDGE = ("gptspec.spec", "gptspec.reference", "gptspec.conformance", "numpy", "hypothesis",
          "math", "builtins", "operator", "json", "dataclasses", "multiprocessing.connection",
          "functools", "itertools", "collections", "contextlib", "copy", "re", "warnings",
          "traceback")
# the worker's answers are encoded by an encoder made before any backend code runs: a
# backend that replaced json.dumps rewrote them (a failure sent as a pass)
_ENCODE = json.JSONEncoder(default=str).encode
_OWN = ("gptspec.spec", "gptspec.reference", "gptspec.conformance")  # and their tables
_TABLES = (int, float, str, bytes, tuple, frozenset, dict, list, set)


_PRINT_DEFAULTS: dict[str, Any] = dict(
    precision=8, threshold=1000, edgeitems=3, linewidth=75, suppress=False, nanstr="nan",
    infstr="inf", sign="-", floatmode="maxprec", legacy=False)


def _table_print(value: Any) -> str:
    """What a module-level constant holds now (the budgets' unit roundoffs, say), spelt
    the same whatever print options a backend set (legacy="1.25" respells NumPy scalars)."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype} {value.shape} {hash(value.tobytes())}"
    with np.printoptions(**_PRINT_DEFAULTS):
        return repr(value)


def _parts(value: Any) -> tuple[Any, ...]:
    """What a function computes with besides its identity, held (so that no id is reused):
    its code, default values and the contents of its closure's cells; a property's or a
    class- or static method's functions."""
    if isinstance(value, property):
        return tuple(_parts(f) for f in (value.fget, value.fset, value.fdel))
    if isinstance(value, (classmethod, staticmethod)):
        return (value.__func__, *_parts(value.__func__))
    if not isinstance(value, types.FunctionType):  # a class, a builtin: itself only
        return ()
    cells = []
    for cell in value.__closure__ or ():
        try:
            cells.append(cell.cell_contents)
        except ValueError:  # a cell not yet filled
            cells.append(None)
    return (value.__code__, value.__defaults__, value.__kwdefaults__, *cells)


def _descriptor(value: Any) -> bool:
    return callable(value) or isinstance(value, (property, classmethod, staticmethod))


def judge_fingerprint() -> dict[str, tuple[Any, Any]]:
    """Every function and class of the judge's loaded modules (and of their classes, with
    their properties and class methods), with its code, defaults and closure: held, so that
    none is collected and its id reused; the modules the judge's own modules name; what
    each constant of those holds, or which object it is; and the interpreter's trace and
    profile hooks."""
    prints: dict[str, tuple[Any, Any]] = {
        "sys.gettrace": (sys.gettrace(), ()), "sys.getprofile": (sys.getprofile(), ())}
    for name, module in list(sys.modules.items()):
        if module is None or not any(name == p or name.startswith(p + ".") for p in _JUDGE):
            continue
        own = any(name == p or name.startswith(p + ".") for p in _OWN)
        for attr, value in list(getattr(module, "__dict__", {}).items()):
            if not callable(value):
                if not own or attr.startswith("__"):
                    continue
                if isinstance(value, (*_TABLES, np.ndarray)):
                    prints[f"{name}.{attr}"] = (None, _table_print(value))
                else:  # a module (budgets.np), an instance: replaced is tampered
                    prints[f"{name}.{attr}"] = (value, ())
                continue
            prints[f"{name}.{attr}"] = (value, _parts(value))
            if isinstance(value, type) and value.__module__ == name:
                for key, method in list(vars(value).items()):
                    if _descriptor(method):
                        prints[f"{name}.{attr}.{key}"] = (method, _parts(method))
    return prints


def _same(a: Any, b: Any) -> bool:
    """Identity, element by element through nested tuples."""
    if type(a) is tuple and type(b) is tuple:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a is b


def tampered(before: dict[str, tuple[Any, Any]]) -> str:
    """Why the judge's code is no longer what ``before`` recorded (the first function a
    backend replaced or rewrote), or "". Isolation keeps a backend from hanging or ending
    the run; the reference still runs in the backend's process, so one that patched it
    could forge a pass: this catches the patch, not a backend that hides it better."""
    now = judge_fingerprint()
    for key, (value, code) in before.items():
        if key in now and (now[key][0] is not value or (
                now[key][1] != code if value is None else not _same(now[key][1], code))):
            return (f"the backend changed the judge's own code or tables ({key}): no check "
                    "of this run can be trusted")
    return ""


def _worker(conn: Any, target: str, device: str | None, dtype: str | None, profile: str,
            seed: int, save_failures: str | None, plain: str | None, output: str,
            within: float | None) -> None:
    # first, before any backend code runs: a session (and process group) of its own, which
    # the parent kills whole, with whatever the backend started in it
    if hasattr(os, "setsid"):
        os.setsid()
    parent = multiprocessing.parent_process()  # the judge: killed with it, even by SIGKILL
    die_with_parent(parent.pid if parent is not None and parent.pid else os.getppid())
    _let_go_of_the_judges_tracker()
    _print_into(output)
    from gptspec.conformance.context import cache_outside_the_working_directory
    from gptspec.conformance.discovery import load_backend
    from gptspec.conformance.registry import CHECKS, all_checks
    from gptspec.conformance.runner import (
        describe_backend,
        device_mismatch,
        dtype_error,
        judged_precision,
        unmet,
    )

    cache_outside_the_working_directory()
    # Ctrl-C reaches every process of the terminal's group: the parent handles it (and
    # stops this one); here it would only print a traceback from inside the backend
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    all_checks()  # every check module loaded (CHECKS filled) before the backend's code runs
    _keep_channel(conn)
    judge = judge_fingerprint()
    umask = os.umask(0o022)  # the judge's, for the failures it saves (keeping_cwd: each check)
    os.umask(umask)
    try:
        backend = load_backend(target, device=device, dtype=dtype)
        os.umask(umask)
        described = describe_backend(backend)  # its dtype read once, for header and budgets
        precision, mismatch = judged_precision(backend, dtype, described["dtype"])
        mismatch = tampered(judge) or mismatch or device_mismatch(backend, device)
    except BaseException as err:  # noqa: BLE001 — whatever the backend raised, in one line
        message = (str(err) if isinstance(err, BackendError) else
                   f"backend {target!r} failed to start: {type(err).__name__} {err}".rstrip())
        refused = {"refused": err.reason} if isinstance(err, BackendRefused) else {}
        _send(conn, _ENCODE({"load_error": message, **refused}).encode())
        return
    origin = {**described, "spec": target, "device": device or described["device"],
              "dtype": dtype or described["dtype"]}
    # the checks it does not implement at all, so that a failure elsewhere does not count
    # them as blocked (runner.walk)
    unmet_by_id = {} if mismatch else {c.id: why for c in all_checks()
                                       if (why := unmet(backend, c))}
    _send(conn, _ENCODE({"backend": described, "unmet": unmet_by_id,
                         "origin": {k: origin[k] for k in ("name", "dtype")}}).encode())
    while True:
        try:
            check_id = conn.recv_bytes().decode()
        except EOFError:
            return
        except OSError as err:
            _channel_lost(err)
        if check_id == "":
            return
        check = CHECKS[check_id]
        try:
            why = "" if mismatch else unmet(backend, check)
            result = (dtype_error(check, mismatch) if mismatch else
                      not_implemented(check, [], why) if why else
                      run_check(check, backend, precision, profile, seed, None, save_failures,
                                origin, plain, dtype is not None, within))
        except BaseException as err:  # noqa: BLE001 — run_check lets KeyboardInterrupt out
            result = CheckResult(check.id, list(check.entries), check.kind, "error", None,
                                 f"the backend raised {type(err).__name__}: {err}".rstrip(": "),
                                 0, 0, 0.0, check.budget)
        if not mismatch:  # a verdict reached with the judge patched is no verdict
            mismatch = tampered(judge)
            if mismatch:
                result = dtype_error(check, mismatch)
        _send(conn, _ENCODE(result.to_dict()).encode())


def _channel_lost(err: OSError) -> NoReturn:
    """The backend closed (or reused) the file descriptor of the worker's channel to the
    judge: said in one line, not in a traceback of the judge's code, and the worker ends
    (the judge reports its exit)."""
    print(f"the worker lost its channel to the judge ({err.strerror or err}): the backend "
          "closed or reused its file descriptor", file=sys.stderr, flush=True)
    os._exit(1)


_CHANNEL: dict[str, Any] = {}  # the worker's channel as it was before the backend loaded


def _keep_channel(conn: Any) -> None:
    _CHANNEL.update(send=type(conn).send_bytes, state=dict(vars(conn)))


def _send(conn: Any, data: bytes) -> None:
    """Send through the channel as it was made: a backend that set its own send_bytes on
    the connection object rewrote the answers (a failure sent as a pass)."""
    if _CHANNEL and vars(conn) != _CHANNEL["state"]:
        vars(conn).clear()
        vars(conn).update(_CHANNEL["state"])
        _CHANNEL["changed"] = True  # no later answer can be trusted either
    if _CHANNEL.get("changed"):
        answer = json.loads(data)
        if "status" in answer:
            answer.update(status="error", worst_fraction=None,
                          detail="the backend changed the worker's channel to the judge: no "
                                 "check of this run can be trusted")
            data = _ENCODE(answer).encode()
    try:
        (_CHANNEL.get("send") or type(conn).send_bytes)(conn, data)
    except OSError as err:
        _channel_lost(err)


_TEXT_FIELDS = ("id", "kind", "status", "detail", "budget", "minimal_example", "reproduce",
                "blocked_by")
_COUNT_FIELDS = ("examples", "comparisons", "not_applicable")


def well_formed(result: CheckResult) -> bool:
    """Whether an answer's fields have the types and values a verdict has: the worker is
    the backend's process, and a backend that wrote into its channel sent anything."""

    def number(x: Any) -> bool:
        return type(x) in (int, float)

    adjudication = result.adjudication
    return (result.status in STATUSES
            and all(type(getattr(result, f)) is str for f in _TEXT_FIELDS)
            and all(type(getattr(result, f)) is int for f in _COUNT_FIELDS)
            and all(type(x) is list and all(type(e) is str for e in x)
                    for x in (result.entries, result.saved))
            and (result.worst_fraction is None or number(result.worst_fraction))
            and number(result.seconds)
            and (adjudication is None or type(adjudication) is dict and all(
                type(k) is str and (v is None or type(v) in (str, int, float, bool))
                for k, v in adjudication.items())))


def _receive(conn: Any, seconds: float | None) -> bytes | None:
    """One answer of the worker's, of at most ANSWER_LIMIT bytes, or None where it is not
    whole within ``seconds`` (a worker that announced a long answer and stalled; the caller
    stops it, which ends the wait). Raises what receiving raises (EOFError: it died)."""
    got: list[Any] = []

    def receive() -> None:
        try:
            got.append(conn.recv_bytes(ANSWER_LIMIT))
        except BaseException as err:  # noqa: BLE001 — handed to the judge's thread
            got.append(err)

    reader = threading.Thread(target=receive, name="gptspec-answer", daemon=True)
    reader.start()
    reader.join(seconds)
    if not got:
        return None
    if isinstance(got[0], BaseException):
        raise got[0]
    return bytes(got[0])


def _death(process: Any) -> str:
    process.join(5)
    code = process.exitcode
    if code is None:
        return "the worker stopped answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the backend crashed the worker process ({name})"
    return f"the backend ended the worker process (exit code {code})"


class _Worker:
    def __init__(self, target: str, device: str | None, dtype: str | None, profile: str,
                 seed: int, save_failures: str | None,
                 start_timeout: float | None = START_TIMEOUT, plain: str | None = None,
                 timeout: float | None = None) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        fd, self.output_path = tempfile.mkstemp(prefix="gptspec-backend-output-")
        self.output = os.fdopen(fd, "rb")
        self.process = context.Process(
            target=_worker,
            args=(child, target, device, dtype, profile, seed, save_failures, plain,
                  self.output_path, timeout),
            daemon=True)
        self.process.start()
        child.close()
        self.backend: dict[str, str] = {}
        self.save_failures = save_failures
        self.origin: dict[str, Any] = {}
        # a module that hangs on import is stopped by the run's time limit too
        try:
            started = self.conn.poll(start_timeout)
        except BaseException:  # Ctrl-C while waiting: the worker must not outlive us
            self.stop()
            raise
        if not started:
            self.stop()
            raise BackendError(f"backend {target!r} did not start within {start_timeout:g} s "
                               "(importing and building it)")
        try:
            greeting = _receive(self.conn, start_timeout)
            if greeting is None:
                self.stop()
                raise BackendError(f"backend {target!r} did not start within "
                                   f"{start_timeout:g} s (its greeting never ended)")
            # the output file is open in the worker now: gone from the folder, so that a
            # judge killed outright leaves none behind
            os.unlink(self.output_path)
            hello = json.loads(greeting)
            if "refused" in hello:
                raise BackendRefused(target, shown(hello["refused"]))
            if "load_error" in hello:
                raise BackendError(shown(hello["load_error"]))
            self.backend = {k: shown(hello["backend"][k], NAME_LIMIT)
                            for k in ("name", "version", "device", "dtype")}
            self.unmet: dict[str, str] = {str(k): shown(v) for k, v in
                                          dict(hello.get("unmet") or {}).items()}
            self.origin = {k: str(v) for k, v in dict(hello.get("origin") or {}).items()}
        except EOFError:
            death = _death(self.process)
            self.stop()
            raise BackendError(f"backend {target!r} failed to start: {death}") from None
        except BackendError:
            self.stop()
            raise
        except Exception:  # noqa: BLE001 — the worker is the backend's process: not trusted
            self.stop()
            raise BackendError(f"backend {target!r} failed to start: its worker sent an "
                               "unreadable greeting") from None

    def run(self, check: Check, timeout: float | None) -> CheckResult:
        begun = time.monotonic()

        def error(detail: str, ended: float | None = None) -> CheckResult:
            # the time the check took, not the limit it had
            took = (ended or time.monotonic()) - begun
            return CheckResult(check.id, list(check.entries), check.kind, "error", None,
                               detail, 0, 0, took, check.budget)

        try:
            self.conn.send_bytes(check.id.encode())
            answer = None
            if self.conn.poll(timeout):
                left = None if timeout is None else max(timeout - (time.monotonic() - begun), 0)
                answer = _receive(self.conn, left)
            if answer is None:
                ended = time.monotonic()
                self.stop()
                self.remove_unfinished(check)
                return error(f"timed out after {timeout:g} s (the worker was stopped)", ended)
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            ended = time.monotonic()  # before waiting for the worker's exit status
            death = _death(self.process)
            if self.process.is_alive():  # its channel broken (an answer past the limit)
                self.stop()
            self.remove_unfinished(check)
            return error(death, ended)
        finally:
            self.relay()
        try:
            result = CheckResult(**json.loads(answer))
            if result.id != check.id or not well_formed(result):
                raise ValueError(result.id)
            fraction = result.worst_fraction
            if result.status == "pass" and fraction is not None and not fraction <= 1.0:
                # no comparison past its budget passes: the verdict was rewritten
                return error(f"the worker sent a pass at {100 * fraction:.3g}% of budget: "
                             "the backend changed the judge's verdict in its process, and "
                             "no check of this run can be trusted")
            return result
        except Exception:  # noqa: BLE001 — the worker runs the backend's code: not trusted
            self.stop()
            return error("the worker sent an unreadable answer (the backend wrote into "
                         "the judge's channel)")

    def remove_unfinished(self, check: Check) -> None:
        """A worker that died while it saved ``check``'s failure left its temporary files:
        removed, once it is dead, so that --save-failures holds finished files only."""
        if self.save_failures is not None and self.origin:
            self.process.join(5)
            if not self.process.is_alive():
                reproduction.remove_unfinished(
                    self.save_failures, reproduction.failure_stem(check.id, self.origin))

    def relay(self) -> None:
        """What the backend printed since the last call (runner.relay_backend_output): as
        much as can be shown is read, the rest counted and dropped, so that a backend
        printing gigabytes costs the judge neither memory nor disk."""
        if self.output.closed:
            return
        data = self.output.read(OUTPUT_READ_LIMIT)
        fd = self.output.fileno()
        rest = os.fstat(fd).st_size - self.output.tell()
        if rest > 0 or len(data) == OUTPUT_READ_LIMIT:
            # the worker appends (O_APPEND): after the cut it writes from the start again
            os.ftruncate(fd, 0)
            self.output.seek(0)
        relay_backend_output(data, unread=max(rest, 0))

    def alive(self) -> bool:
        return self.process.is_alive()

    def stop(self) -> None:
        """End the worker and everything in its process group (what the backend forked):
        asked to stop first, then killed. Safe to call more than once."""
        try:
            if self.process.is_alive():
                try:
                    self.conn.send_bytes(b"")
                except OSError:
                    pass
                self.process.join(1)
        finally:  # a second Ctrl-C in the join: the group is killed all the same (the
            self._kill_group()  # exit then waited for ever on a worker ignoring SIGTERM)
        self.process.join(5)
        self.conn.close()
        if not self.output.closed:
            self.relay()
            self.output.close()
            try:
                os.unlink(self.output_path)
            except OSError:  # unlinked once the worker had opened it
                pass

    def _kill_group(self) -> None:
        # the group's id is the worker's pid, which stays taken while any member of the
        # group lives: once the group is empty this is a harmless "no such process"
        pid = self.process.pid
        if pid is not None and hasattr(os, "killpg"):
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if self.process.is_alive():  # no process groups here, or it had not made its own
            self.process.kill()


def _children() -> set[int]:
    """Linux: the pids of this process's children (none where /proc cannot be read)."""
    me, kids = os.getpid(), set[int]()
    try:
        names = os.listdir("/proc")
    except OSError:
        return kids
    for name in names:
        try:
            with open(f"/proc/{name}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) == me:
                    kids.add(int(name))
        except (OSError, ValueError, IndexError):
            continue
    return kids


def _adopt_orphans() -> set[int] | None:
    """Linux: make the judge the subreaper of its descendants, so that a process a backend
    left behind in a session of its own becomes the judge's child (not init's) and can be
    ended with the run; the children the judge has already (None: not possible here)."""
    try:
        import ctypes

        if ctypes.CDLL(None, use_errno=True).prctl(36, 1) != 0:  # PR_SET_CHILD_SUBREAPER
            return None
    except (OSError, AttributeError):
        return None
    return _children()


def _end_orphans(before: set[int] | None) -> None:
    """Kill (and reap) the children the judge adopted during the run: what a backend
    started and left, which would otherwise outlive the run (and, say, rewrite its report)."""
    if before is None:
        return
    from multiprocessing import resource_tracker

    keep = before | {getattr(resource_tracker._resource_tracker, "_pid", None) or -1}
    for _ in range(20):  # one that forks while being killed leaves a new orphan
        stray = _children() - keep
        if not stray:
            return
        for pid in stray:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass


def run_isolated(target: str, *, device: str | None = None, dtype: str | None = None,
                 profile: str = "default", seed: int = 0,
                 select: Callable[[Check], bool] | None = None, area: str | None = "forward",
                 reproduce: str = "", timeout: float | None = 300.0,
                 save_failures: str | None = None,
                 on_result: Callable[[CheckResult], None] | None = None,
                 header: Callable[[SuiteResult], None] | None = None,
                 plain: str | None = None) -> SuiteResult:
    """``run_suite`` for the backend named by ``target``, each check in a worker process.
    Raises BackendError only if the backend cannot be built at all."""
    start_timeout = START_TIMEOUT if timeout is None else timeout
    adopted = _adopt_orphans()
    try:
        worker: _Worker | None = _Worker(target, device, dtype, profile, seed, save_failures,
                                         start_timeout, plain, timeout)
    except BaseException:
        _end_orphans(adopted)
        raise
    assert worker is not None
    suite = SuiteResult(dict(worker.backend),
                        suite_settings_dict(profile, seed, area, timeout, isolated=True))
    unmet_by_id = dict(worker.unmet)
    if header:
        header(suite)

    def evaluate(check: Check) -> CheckResult:
        nonlocal worker
        if worker is None or not worker.alive():
            try:
                worker = _Worker(target, device, dtype, profile, seed, save_failures,
                                 start_timeout, plain, timeout)
            except BackendError as err:
                worker = None
                return CheckResult(check.id, list(check.entries), check.kind, "error", None,
                                   f"could not restart the backend: {err}", 0, 0, 0.0,
                                   check.budget)
        result = worker.run(check, timeout)
        if not worker.alive():
            worker.stop()
            worker = None
        return result

    try:
        for result in walk(all_checks(area), select, evaluate, reproduce, seed,
                           lambda check: unmet_by_id.get(check.id, "")):
            suite.results.append(result)
            if on_result:
                on_result(result)
    finally:
        if worker is not None:
            worker.stop()
        _end_orphans(adopted)
    return suite
