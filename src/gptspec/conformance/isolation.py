"""A backend in a worker process that only serves its calls, judged from this process.

The judge (Hypothesis, the reference, the budgets, the verdict, saving and adjudicating
failures) runs here and never runs the backend's code. A 'spawn'ed worker builds the
backend and answers requests (an attribute, a call, an array, an item, an iteration):
results come back as a JSON header and raw array buffers, never a pickle, read here as
plain data; other objects stay there behind a ``Remote``. A backend writing into the
channel can only misstate its own results. A check past its time limit, a worker that
dies or sends what it does not write, is that check's error and a fresh worker takes the
next. The worker's process group, and every process the backend left, end with the run.
(The answers' format: :mod:`wire`; what is done about processes: :mod:`processes`.)
"""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from gptspec.conformance.context import Guarded, UnreadableOutput, plain_output
from gptspec.conformance.discovery import BackendError, BackendRefused
from gptspec.conformance.processes import (
    adopt_orphans,
    dumpable_again,
    end_orphans,
    let_go_of_the_judges_tracker,
    print_into,
    undumpable,
    without_ptrace,
)
from gptspec.conformance.protocol import WorkerLost, shown
from gptspec.conformance.registry import Check, all_checks
from gptspec.conformance.runner import (
    NAME_LIMIT,
    CheckResult,
    SuiteResult,
    dtype_error,
    judged_precision,
    not_implemented,
    relay_backend_output,
    run_check,
    suite_settings_dict,
    time_limit,
    walk,
)
from gptspec.conformance.wire import (
    ANSWER_LIMIT,
    ARRAYS_LIMIT,
    HEADER_LIMIT,
    Encoder,
    UnreadableAnswer,
    decode,
    decode_raised,
    encode_raised,
)
from gptspec.parent_death import die_with_parent

START_TIMEOUT = 300.0  # seconds to import and build the backend, unless --timeout says
FORGET_SECONDS = 1.0  # the least a check's 'forget' gets, its limit spent or not
# bytes of what a backend printed read per relay: what relay_backend_output can show (its
# lines of at most OUTPUT_LINE_LIMIT characters), with room; the rest is counted, not read
OUTPUT_READ_LIMIT = 1 << 20


# --- the worker: builds the backend, then serves the judge's calls of it


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, objects: dict[int, Any]) -> None:
        super().__init__(io.BytesIO(data))
        self.objects = objects

    def persistent_load(self, pid: Any) -> Any:  # a handle the judge passes back
        return self.objects[pid]


def _serve(conn: Any, backend: Any) -> None:
    """Answer the judge's requests until it sends an empty one or goes. A request is
    (operation, handle, name, args, kwargs) on the object ``handle`` names (0: the
    backend): "get" an attribute, "call" a method (or the object), "array" (np.asarray),
    "repr", "len", "item", "iter", "next", or "forget" every handle but the backend's."""
    objects: dict[int, Any] = {0: backend}
    pid = os.getpid()

    def keep(value: Any) -> int:
        objects[len(objects)] = value
        return len(objects) - 1

    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):
            return
        if not request:
            return
        what, handle, name, args, kwargs = _Unpickler(request, objects).load()
        label = name or f"handle {handle}"
        try:
            value = _answer(what, objects, handle, name, args, kwargs)
            encoder = Encoder(keep)
            answer: dict[str, Any] = (
                {"callable": True} if value is _CALLABLE else
                {"value": encoder.tree(plain_output(value, label))})
            buffers = encoder.buffers
            answer["sizes"] = [b.nbytes for b in buffers]
            header = _header(answer)
        except BaseException as err:  # noqa: BLE001 — whatever the backend raised
            buffers = []
            header = _header({"raised": encode_raised(err)})
        finally:
            if os.getpid() != pid:  # a fork of the backend's returned here: it ends
                os._exit(0)
        try:
            conn.send_bytes(header)
            for data in buffers:
                conn.send_bytes(data)
        except OSError as err:
            print(f"the worker lost its channel to the judge ({err.strerror or err}): the "
                  "backend closed or reused its file descriptor", file=sys.stderr,
                  flush=True)
            os._exit(1)


def _header(answer: dict[str, Any]) -> bytes:
    """The answer's JSON header, refused here (the check's error, the worker serving on)
    where the judge would not read it."""
    try:
        header = json.dumps(answer).encode()
    except (ValueError, TypeError, RecursionError) as err:
        raise UnreadableOutput(f"returned what cannot be sent to the judge ({shown(err, 200)})") \
            from None
    if len(header) > HEADER_LIMIT:
        raise UnreadableOutput(f"returned {len(header) >> 20} MiB of Python data besides its "
                               f"arrays (at most {HEADER_LIMIT >> 20} MiB): return arrays")
    return header


_CALLABLE = object()  # "get" of a callable attribute: the judge's proxy calls it by name


def _answer(what: str, objects: dict[int, Any], handle: int, name: str | None,
            args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    obj = objects[handle]
    if what == "forget":
        for key in [k for k in objects if k != 0]:
            del objects[key]
        return None
    if what == "get":
        value = getattr(obj, name or "")
        return _CALLABLE if callable(value) else value
    if what == "call":
        fn = obj if name is None else getattr(obj, name)
        return fn(*args, **kwargs)  # (its working directory, np.seterr: its process's own)
    if what == "array":
        return np.asarray(obj, *args)
    if what == "repr":
        return shown(repr(obj), 200)
    if what == "len":
        return int.__add__(len(obj), 0)
    if what == "item":
        return obj[args[0]]
    if what == "iter":
        return Guarded(iter(obj), "")
    if what == "next":
        try:
            return ["next", next(obj)]
        except StopIteration:
            return ["stop"]
    raise ValueError(f"unknown request {what!r}")


def _worker(conn: Any, target: str, device: str | None, dtype: str | None,
            output: str) -> None:
    # first, before any backend code runs: a session (and process group) of its own, which
    # the parent kills whole, with whatever the backend started in it
    if hasattr(os, "setsid"):
        os.setsid()
    parent = multiprocessing.parent_process()  # the judge: killed with it, even by SIGKILL
    die_with_parent(parent.pid if parent is not None and parent.pid else os.getppid())
    let_go_of_the_judges_tracker()
    without_ptrace()
    print_into(output)
    from gptspec.conformance.discovery import load_backend
    from gptspec.conformance.runner import describe_backend, device_mismatch, unmet

    # Ctrl-C reaches every process of the terminal's group: the parent handles it (and
    # stops this one); here it would only print a traceback from inside the backend
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        backend = load_backend(target, device=device, dtype=dtype)
        described = describe_backend(backend)  # its dtype read once, for header and budgets
        mismatch = device_mismatch(backend, device)
        # the checks it does not implement at all, so that a failure elsewhere does not
        # count them as blocked (runner.walk)
        unmet_by_id = {c.id: why for c in all_checks() if (why := unmet(backend, c))}
    except BaseException as err:  # noqa: BLE001 — whatever the backend raised, in one line
        message = (str(err) if isinstance(err, BackendError) else
                   f"backend {target!r} failed to start: {type(err).__name__} {err}".rstrip())
        refused = {"refused": err.reason} if isinstance(err, BackendRefused) else {}
        conn.send_bytes(json.dumps({"load_error": message, **refused}).encode())
        return
    kind = type(backend)
    conn.send_bytes(json.dumps({"backend": described, "unmet": unmet_by_id,
                                "mismatch": mismatch,
                                "class": f"{kind.__module__}.{kind.__qualname__}"}).encode())
    _serve(conn, backend)


# --- the judge's side


class Remote(Guarded):
    """An object in the worker's process (the backend itself, or something one of its calls
    returned that is not data), reached only by requests: its attributes, calls, items and
    iteration answer data, or another Remote."""

    def __init__(self, worker: _Worker, handle: int, name: str) -> None:
        self._worker = worker
        self._handle = handle
        self._name = name
        self._class = ""  # the backend's: the class the worker built (reproduction.adjudicate)

    def _ask(self, what: str, name: str | None = None, *args: Any, **kwargs: Any) -> Any:
        return self._worker.ask(what, self._handle, name, args, kwargs,
                                f"{self._name}.{name}" if name else self._name)

    def __getattr__(self, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        value = self._ask("get", attribute)
        if not isinstance(value, _CallableAnswer):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._worker.ask("call", self._handle, attribute, args, kwargs,
                                    f"{self._name}.{attribute}")

        call.__name__ = attribute
        return call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._worker.ask("call", self._handle, None, args, kwargs, self._name)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        value = self._ask("array", None, *([] if dtype is None else [dtype]))
        if type(value) is not np.ndarray:
            raise TypeError(f"{self._name} cannot be read as an array")
        return value

    def __repr__(self) -> str:
        value = self._ask("repr")
        return value if type(value) is str else "(unprintable)"

    def __len__(self) -> int:
        value = self._ask("len")
        if type(value) is not int:
            raise TypeError(f"len({self._name}) is not an int")
        return value

    def __getitem__(self, key: Any) -> Any:
        return self._ask("item", None, key)

    def __iter__(self) -> Any:
        items = self._ask("iter")
        while True:
            step = self._worker.ask("next", items._handle, None, (), {}, f"iter({self._name})")
            if step == ["stop"]:
                return
            if type(step) is not list or len(step) != 2 or step[0] != "next":
                raise UnreadableAnswer("a malformed iteration step")
            yield step[1]


class _CallableAnswer:
    """What "get" answers for a callable attribute: the proxy calls it by name."""


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:  # a Remote passed back: its handle
        return obj._handle if isinstance(obj, Remote) else None


class _Worker:
    """The judge's end of one worker: starts it (the backend built there), asks it for
    calls, relays what the backend printed, and stops it with its whole process group."""

    def __init__(self, target: str, device: str | None, dtype: str | None,
                 start_timeout: float | None = START_TIMEOUT) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        fd, self.output_path = tempfile.mkstemp(prefix="gptspec-backend-output-")
        self.output = os.fdopen(fd, "rb")
        self.process = context.Process(target=_worker,
                                       args=(child, target, device, dtype, self.output_path),
                                       daemon=True)
        self.process.start()
        child.close()
        self.lost = ""  # why the worker can answer no more ("" while it can)
        self.backend = Remote(self, 0, "backend")
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
            if greeting is None:  # a frame begun and never ended
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
            self.described = {k: shown(hello["backend"][k], NAME_LIMIT)
                              for k in ("name", "version", "device", "dtype")}
            self.unmet: dict[str, str] = {str(k): shown(v) for k, v in
                                          dict(hello.get("unmet") or {}).items()}
            self.mismatch = shown(hello.get("mismatch") or "")
            self.backend._class = shown(str(hello.get("class", "")), NAME_LIMIT)
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

    def ask(self, what: str, handle: int, name: str | None, args: tuple[Any, ...],
            kwargs: dict[str, Any], label: str) -> Any:
        """One request, answered: the value (data, or a Remote), or what the call raised,
        raised here. WorkerLost where the worker cannot answer; an interruption (the
        check's time limit, Ctrl-C) leaves the worker lost too, its answer unread."""
        if self.lost:
            raise WorkerLost(self.lost)
        done = False
        try:
            buffer = io.BytesIO()
            _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(
                (what, handle, name, args, kwargs))
            self.conn.send_bytes(buffer.getbuffer())
            answer = json.loads(self.conn.recv_bytes(HEADER_LIMIT))
            if type(answer) is not dict:
                raise UnreadableAnswer("not an object")
            buffers: list[bytearray] = []
            if "value" in answer:
                sizes = answer.get("sizes", [])
                if (type(sizes) is not list or len(sizes) > ARRAYS_LIMIT
                        or not all(type(n) is int and n >= 0 for n in sizes)
                        or sum(sizes) > ANSWER_LIMIT):
                    raise UnreadableAnswer("malformed array sizes")
                for size in sizes:  # each read once, into memory the judge owns
                    buffers.append(bytearray(size))
                    if self.conn.recv_bytes_into(buffers[-1]) != size:
                        raise UnreadableAnswer("an array shorter than announced")
            if self.conn.poll(0):  # more than the worker writes: the backend wrote it
                raise UnreadableAnswer("a frame after the answer")
            done = True
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError) as err:
            if isinstance(err, EOFError) or not self.process.is_alive():
                self.lost = _death(self.process)
            else:  # a frame past the limit (bad message length), a descriptor reused
                self.lost = _unreadable(err)
            raise WorkerLost(self.lost) from None
        except (UnreadableAnswer, ValueError, UnicodeDecodeError) as err:
            self.lost = _unreadable(err)
            raise WorkerLost(self.lost) from None
        finally:
            if not done and not self.lost:  # interrupted mid-request: the channel is out
                self.lost = "the worker was stopped mid-call"  # of step, the worker spent
        try:  # (outside the channel's handlers: what the backend raised is raised as is)
            if answer.get("callable") is True:
                return _CallableAnswer()
            if "raised" in answer:
                raised = decode_raised(answer["raised"], label)
            else:
                return decode(answer.get("value"), buffers,
                               lambda h: Remote(self, h, f"{label}()"))
        except (UnreadableAnswer, ValueError, UnicodeDecodeError) as err:
            self.lost = _unreadable(err)  # what the worker never writes
            raise WorkerLost(self.lost) from None
        raise raised

    def forget(self, seconds: float | None) -> None:
        """Drop what the last check's calls left in the worker (tokenizers, iterators), within
        ``seconds`` (a finalizer of the backend's runs there). Anything but the worker's
        plain answer, or none in time, and the worker is lost."""
        try:
            with time_limit(seconds):
                answer = self.ask("forget", 0, None, (), {}, "forget")
        except WorkerLost:
            raise
        except BaseException as err:
            if isinstance(err, KeyboardInterrupt):
                raise
            self.lost = ("the backend did not let go of the objects its calls returned "
                         f"within the check's limit ({shown(err, 200) or type(err).__name__})")
            raise WorkerLost(self.lost) from None
        if answer is not None:
            self.lost = "the worker sent an unreadable answer (the backend wrote into its channel)"
            raise WorkerLost(self.lost)

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
        return not self.lost and self.process.is_alive()

    def stop(self) -> None:
        """End the worker and everything in its process group (what the backend forked):
        asked to stop first, then killed. Safe to call more than once."""
        try:
            if self.process.is_alive() and not self.lost:
                try:
                    self.conn.send_bytes(b"")
                except OSError:
                    pass
                self.process.join(1)
        finally:  # a second Ctrl-C in the join: the group is killed all the same (the
            self._kill_group()  # exit then waited for ever on a worker ignoring SIGTERM)
        self.process.join(5)
        self.conn.close()
        self.lost = self.lost or "the worker was stopped"
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


def _unreadable(err: BaseException) -> str:
    return ("the worker sent an unreadable answer (the backend wrote into the judge's "
            f"channel: {shown(err, 200)})")


def _receive(conn: Any, seconds: float | None) -> bytes | None:
    """One frame of at most HEADER_LIMIT bytes, or None where it is not whole within
    ``seconds`` (a frame announced and stalled: the caller stops the worker, which ends
    the wait). Raises what receiving raises (EOFError: the worker died)."""
    got: list[Any] = []

    def receive() -> None:
        try:
            got.append(conn.recv_bytes(HEADER_LIMIT))
        except BaseException as err:  # noqa: BLE001 — handed to the judge's thread
            got.append(err)

    reader = threading.Thread(target=receive, name="gptspec-greeting", daemon=True)
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


class IsolatedJudge:
    """The judge of one backend built in worker processes: ``evaluate(check)`` judges a
    check here, the backend's calls served by the worker (a fresh one after a time-out,
    a death or a channel out of step). ``close()`` stops the worker and ends whatever the
    backend left running. Raises BackendError (BackendRefused) where the backend cannot
    be built at all (declines the dtype or device asked)."""

    def __init__(self, target: str, *, device: str | None, dtype: str | None,
                 profile: str, seed: int, timeout: float | None,
                 save_failures: str | None = None, plain: str | None = None) -> None:
        self.target, self.device, self.dtype = target, device, dtype
        self.profile, self.seed, self.timeout = profile, seed, timeout
        self.save_failures, self.plain = save_failures, plain
        self.start_timeout = START_TIMEOUT if timeout is None else timeout
        self.adopted = adopt_orphans()
        self.dumpable = undumpable()
        self.worker: _Worker | None = None
        try:
            self.worker = _Worker(target, device, dtype, self.start_timeout)
            self.described = dict(self.worker.described)
            try:
                self.precision, mismatch = judged_precision(None, dtype,
                                                            self.described["dtype"])
            except (KeyError, ValueError) as err:
                raise BackendError(f"backend {target!r}: its dtype "
                                   f"{self.described['dtype']!r} is not one the suite "
                                   f"judges ({err})") from None
        except BaseException:
            self.close()
            raise
        self.greeting = _greeting(self.worker)
        self.mismatch = mismatch or self.worker.mismatch
        self.origin = {**self.described, "spec": target,
                       "device": device or self.described["device"],
                       "dtype": dtype or self.described["dtype"]}
        self.unmet_by_id = {} if self.mismatch else dict(self.worker.unmet)

    def unmet(self, check: Check) -> str:
        return self.unmet_by_id.get(check.id, "")

    def evaluate(self, check: Check) -> CheckResult:
        if self.mismatch:
            return dtype_error(check, self.mismatch)
        if self.unmet(check):
            return not_implemented(check, [], self.unmet(check))
        if self.worker is None or not self.worker.alive():
            if self.worker is not None:
                self.worker.stop()
            try:
                self.worker = _Worker(self.target, self.device, self.dtype, self.start_timeout)
            except BackendError as err:
                self.worker = None
                return CheckResult(check.id, list(check.entries), check.kind, "error", None,
                                   f"could not restart the backend: {err}", 0, 0, 0.0,
                                   check.budget)
            restarted = self.worker
            if _greeting(restarted) != self.greeting:
                # judged by the first one's dtype and operations, shown under its name
                restarted.stop()
                self.worker = None
                return CheckResult(check.id, list(check.entries), check.kind, "error", None,
                                   "the backend, restarted, described itself otherwise "
                                   "(name, version, device, dtype or operations)", 0, 0, 0.0,
                                   check.budget)
        worker = self.worker
        started = time.monotonic()
        try:
            result = run_check(check, worker.backend, self.precision, self.profile, self.seed,
                               self.timeout, self.save_failures, self.origin, self.plain,
                               self.dtype is not None, build_plain=self._plain_in_a_worker)
            if not worker.lost:  # what its calls returned, dropped (a finalizer may run)
                try:
                    # within what is left of the check's limit (FORGET_SECONDS at least,
                    # for the request itself): with a limit of its own, a check whose
                    # objects' finalizers slept passed in twice its limit
                    worker.forget(None if self.timeout is None else max(
                        self.timeout - (time.monotonic() - started), FORGET_SECONDS))
                except WorkerLost as err:
                    if result.status in ("pass", "not-applicable"):
                        result.status, result.worst_fraction = "error", None
                        result.detail = str(err)
                result.seconds = time.monotonic() - started
        finally:
            worker.relay()
        if worker.lost:  # timed out mid-call, died, or its channel is out of step
            if result.status == "error" and "timed out" in result.detail:
                result.detail += " (the worker was stopped)"
            worker.stop()
            self.worker = None
        return result

    @contextlib.contextmanager
    def _plain_in_a_worker(self, target: str, dtype: str) -> Iterator[Any]:
        """The plain implementation an adjudication compares with, built in a worker of its
        own as the backend is: in the judge's process it ran unguarded, and its os._exit
        ended a failing run with status 0."""
        worker = _Worker(target, "cpu", dtype, self.start_timeout)
        try:
            yield worker.backend
        finally:
            worker.stop()  # (what it printed relayed, its processes ended)

    def close(self) -> None:
        try:
            if self.worker is not None:
                self.worker.stop()
                self.worker = None
        finally:
            end_orphans(self.adopted)
            self.adopted = None
            dumpable_again(self.dumpable)
            self.dumpable = None


def _greeting(worker: _Worker) -> tuple[Any, ...]:
    return worker.described, worker.mismatch, worker.unmet


def run_isolated(target: str, *, device: str | None = None, dtype: str | None = None,
                 profile: str = "default", seed: int = 0,
                 select: Callable[[Check], bool] | None = None, area: str | None = "forward",
                 reproduce: str = "", timeout: float | None = 300.0,
                 save_failures: str | None = None,
                 on_result: Callable[[CheckResult], None] | None = None,
                 header: Callable[[SuiteResult], None] | None = None,
                 plain: str | None = None) -> SuiteResult:
    """``run_suite`` for the backend named by ``target``, built in a worker process that
    serves its calls, the checks judged here. Raises BackendError only if the backend
    cannot be built at all."""
    judge = IsolatedJudge(target, device=device, dtype=dtype, profile=profile, seed=seed,
                          timeout=timeout, save_failures=save_failures, plain=plain)
    try:
        suite = SuiteResult(judge.described, suite_settings_dict(profile, seed, area, timeout,
                                                                 isolated=True))
        if header:
            header(suite)
        for result in walk(all_checks(area), select, judge.evaluate, reproduce, seed,
                           judge.unmet):
            suite.results.append(result)
            if on_result:
                on_result(result)
    finally:
        judge.close()
    return suite
