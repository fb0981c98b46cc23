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
import time
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
          "math", "builtins", "operator", "json", "dataclasses", "multiprocessing.connection")
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


def judge_fingerprint() -> dict[str, tuple[Any, Any]]:
    """Every function and class of the judge's loaded modules (and of their classes), with
    its code object: held, so that none is collected and its id reused; and what each
    constant of the judge's own modules holds."""
    prints: dict[str, tuple[Any, Any]] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not any(name == p or name.startswith(p + ".") for p in _JUDGE):
            continue
        own = any(name == p or name.startswith(p + ".") for p in _OWN)
        for attr, value in list(getattr(module, "__dict__", {}).items()):
            if not callable(value):
                if own and isinstance(value, (*_TABLES, np.ndarray)) and not attr.startswith("__"):
                    prints[f"{name}.{attr}"] = (None, _table_print(value))
                continue
            prints[f"{name}.{attr}"] = (value, getattr(value, "__code__", None))
            if isinstance(value, type) and value.__module__ == name:
                for key, method in list(vars(value).items()):
                    if callable(method):
                        prints[f"{name}.{attr}.{key}"] = (method,
                                                          getattr(method, "__code__", None))
    return prints


def tampered(before: dict[str, tuple[Any, Any]]) -> str:
    """Why the judge's code is no longer what ``before`` recorded (the first function a
    backend replaced or rewrote), or "". Isolation keeps a backend from hanging or ending
    the run; the reference still runs in the backend's process, so one that patched it
    could forge a pass: this catches the patch, not a backend that hides it better."""
    now = judge_fingerprint()
    for key, (value, code) in before.items():
        if key in now and (now[key][0] is not value or (
                now[key][1] != code if value is None else now[key][1] is not code)):
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
        precision, mismatch = judged_precision(backend, dtype)
        mismatch = tampered(judge) or mismatch or device_mismatch(backend, device)
        described = describe_backend(backend)
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
            hello = json.loads(self.conn.recv_bytes())
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
            if not self.conn.poll(timeout):
                ended = time.monotonic()
                self.stop()
                self.remove_unfinished(check)
                return error(f"timed out after {timeout:g} s (the worker was stopped)", ended)
            answer = self.conn.recv_bytes()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            ended = time.monotonic()  # before waiting for the worker's exit status
            death = _death(self.process)
            self.remove_unfinished(check)
            return error(death, ended)
        finally:
            self.relay()
        try:
            result = CheckResult(**json.loads(answer))
            if result.id != check.id or result.status not in STATUSES:
                raise ValueError(result.id)
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
        """What the backend printed since the last call (runner.relay_backend_output)."""
        if not self.output.closed:
            relay_backend_output(self.output.read())

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
            except OSError:
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
