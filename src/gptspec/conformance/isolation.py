"""A backend in a worker process that only serves its calls, judged from this process.

The judge (Hypothesis, the reference, the budgets, the verdict, saving and adjudicating
failures) runs here and never runs the backend's code. A 'spawn'ed worker builds the
backend and answers requests (an attribute, a call, an array, an item, an iteration):
results come back as a JSON header and raw array buffers, never a pickle, read here as
plain data; other objects stay there behind a ``Remote``. A backend writing into the
channel can only misstate its own results. A check past its time limit, a worker that
dies or sends what it does not write, is that check's error and a fresh worker takes the
next. The worker's process group, and every process the backend left, end with the run.
"""

from __future__ import annotations

import builtins
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
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from gptspec.conformance.context import (
    BackendInterrupt,
    BackendSteered,
    Guarded,
    UnreadableOutput,
    _from_a_framework,
    plain_output,
)
from gptspec.conformance.discovery import BackendError, BackendRefused
from gptspec.conformance.protocol import NotApplicable, WorkerLost, shown
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
from gptspec.parent_death import die_with_parent

START_TIMEOUT = 300.0  # seconds to import and build the backend, unless --timeout says
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


# --- the wire. The judge sends pickles (the worker trusts its judge); the worker sends a
# JSON header and the raw bytes of the arrays it names, read here as data and nothing else:
# a backend that writes into the channel can only misstate its own results, which the judge
# compares like any other.

HEADER_LIMIT = 16 << 20  # bytes of one answer's JSON header
ANSWER_LIMIT = 4 << 30  # bytes of the arrays of one answer, all together
_ARRAY_KINDS = "biufc"  # bool, signed and unsigned integers, floats, complex numbers
_ARRAYS_LIMIT = 1 << 20  # arrays in one answer
_DEPTH = 70  # levels of containers in one answer (plain_output allows 64)


class _Encoder:
    """What a backend's call returned (already plain_output's data), as a JSON-able tree
    and array buffers; any object that is not data stays in the worker, sent as a handle."""

    def __init__(self, keep: Callable[[Any], int]) -> None:
        self.keep = keep
        self.buffers: list[np.ndarray] = []
        self.size = 0

    def array(self, value: np.ndarray) -> list[Any]:
        if value.dtype.kind == "V" and value.dtype.fields is None and value.dtype.itemsize <= 2:
            try:  # ml_dtypes' bfloat16 and float8 (JAX's): float32 holds each value exactly
                value = value.astype(np.float32)
            except (TypeError, ValueError):
                pass
        if value.dtype.kind not in _ARRAY_KINDS or value.dtype.fields is not None:
            raise UnreadableOutput(f"returned an array of dtype {value.dtype}, which is "
                                   "not numbers")
        self.size += value.nbytes
        if self.size > ANSWER_LIMIT or len(self.buffers) >= _ARRAYS_LIMIT:
            raise UnreadableOutput(f"returned more than {ANSWER_LIMIT >> 30} GiB of arrays")
        # (np.ascontiguousarray would make a 0-d array 1-d)
        data = value if value.flags.c_contiguous else value.copy(order="C")
        self.buffers.append(data.reshape(-1).view(np.uint8))
        return ["array", len(self.buffers) - 1, data.dtype.str, list(data.shape)]

    def tree(self, value: Any) -> Any:
        if value is None or type(value) in (bool, int, str):
            return value
        if type(value) is float:
            return value if np.isfinite(value) else ["float", repr(value)]
        if type(value) is complex:
            return ["complex", self.tree(value.real), self.tree(value.imag)]
        if type(value) is bytes:
            return ["bytes", value.hex()]
        if type(value) in (list, tuple):
            return [type(value).__name__, [self.tree(v) for v in value]]
        if type(value) is dict:
            return ["dict", [[self.tree(k), self.tree(v)] for k, v in value.items()]]
        if isinstance(value, np.generic):
            return ["scalar", self.array(np.asarray(value))]
        if type(value) is np.ndarray:
            if value.dtype.kind == "O":
                return ["objects", list(value.shape),
                        [self.tree(v) for v in value.ravel().tolist()]]
            return self.array(value)
        if isinstance(value, Guarded):
            return ["handle", self.keep(value._wrapped)]
        raise UnreadableOutput(f"returned a {type(value).__name__} the judge cannot read")


class UnreadableAnswer(Exception):
    """An answer of the worker's that is not what the worker writes (the backend wrote
    into the channel)."""


_USED = bytearray()  # a buffer an array of the answer has taken


def _decode(tree: Any, buffers: list[bytearray], remote: Callable[[int], Any],
            depth: int = 0) -> Any:
    """The judge's reading of an answer: only the forms _Encoder writes."""
    if depth > _DEPTH:
        raise UnreadableAnswer("nested too deeply")
    if tree is None or type(tree) in (bool, int, float, str):
        return tree
    if type(tree) is not list or not tree or type(tree[0]) is not str:
        raise UnreadableAnswer(f"an unknown form {type(tree).__name__}")
    kind, args = tree[0], tree[1:]

    def inner(x: Any) -> Any:
        return _decode(x, buffers, remote, depth + 1)

    if kind == "float" and len(args) == 1 and args[0] in ("nan", "inf", "-inf"):
        return float(args[0])
    if kind == "complex" and len(args) == 2:
        real, imag = inner(args[0]), inner(args[1])
        if type(real) is not float or type(imag) is not float:
            raise UnreadableAnswer("a complex number of no floats")
        return complex(real, imag)
    if kind == "bytes" and len(args) == 1 and type(args[0]) is str:
        return bytes.fromhex(args[0])
    if kind in ("list", "tuple") and len(args) == 1 and type(args[0]) is list:
        items = [inner(v) for v in args[0]]
        return items if kind == "list" else tuple(items)
    if kind == "dict" and len(args) == 1 and type(args[0]) is list:
        pairs = args[0]
        if not all(type(p) is list and len(p) == 2 for p in pairs):
            raise UnreadableAnswer("a dict of no pairs")
        return {inner(k): inner(v) for k, v in pairs}
    if kind == "scalar" and len(args) == 1:
        array = inner(args[0])
        if type(array) is not np.ndarray or array.shape != ():
            raise UnreadableAnswer("a scalar of no 0-d array")
        return array[()]
    if kind == "array" and len(args) == 3:
        index, dtype, shape = args
        if (type(index) is not int or not 0 <= index < len(buffers) or type(dtype) is not str
                or type(shape) is not list
                or not all(type(n) is int and n >= 0 for n in shape)):
            raise UnreadableAnswer("a malformed array")
        try:
            kind_of = np.dtype(dtype)
        except TypeError:
            raise UnreadableAnswer(f"an array of unknown dtype {dtype!r}") from None
        if kind_of.kind not in _ARRAY_KINDS or kind_of.fields is not None:
            raise UnreadableAnswer(f"an array of dtype {dtype!r}")
        data = buffers[index]
        if data is _USED:
            raise UnreadableAnswer("one buffer for two arrays")
        if len(data) != kind_of.itemsize * int(np.prod(shape, dtype=object)):
            raise UnreadableAnswer("an array whose bytes do not fill its shape")
        buffers[index] = _USED
        # writable, owned by the judge (a bytearray), as an array a call returns
        return np.frombuffer(data, dtype=kind_of).reshape(shape)
    if kind == "objects" and len(args) == 2 and type(args[1]) is list:
        shape = args[0]
        if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape):
            raise UnreadableAnswer("a malformed object array")
        items = [inner(v) for v in args[1]]
        if len(items) != int(np.prod(shape, dtype=object)):
            raise UnreadableAnswer("an object array whose items do not fill its shape")
        return np.array(items + [None], dtype=object)[:-1].reshape(shape)
    if kind == "handle" and len(args) == 1 and type(args[0]) is int:
        return remote(args[0])
    raise UnreadableAnswer(f"an unknown form {kind!r}")


# --- the worker: builds the backend, then serves the judge's calls of it


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, objects: dict[int, Any]) -> None:
        super().__init__(io.BytesIO(data))
        self.objects = objects

    def persistent_load(self, pid: Any) -> Any:  # a handle the judge passes back
        return self.objects[pid]


def _raised(err: BaseException) -> dict[str, Any]:
    """What a backend's call raised, as the judge rebuilds it."""
    kind = type(err)
    where = traceback.extract_tb(err.__traceback__)
    # the backend's frame; none for what the worker's own reading of its result raised
    frame = where[-1] if where and not isinstance(err, UnreadableOutput) else None
    return {"type": shown(kind.__qualname__, 200), "module": shown(kind.__module__, 200),
            "message": shown(_message(err)),
            "at": f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}" if frame else "",
            # the built-in exceptions it is a kind of, nearest first (a tokenizer's error is
            # a ValueError; a UnicodeDecodeError, which takes five arguments, a ValueError)
            "bases": [k.__name__ for k in kind.__mro__ if k.__module__ == "builtins"
                      and issubclass(k, Exception)][:16],
            "not_applicable": isinstance(err, NotApplicable),
            "interrupt": isinstance(err, KeyboardInterrupt),
            "framework": _from_a_framework(err)}


def _message(err: BaseException) -> str:
    try:
        text = str(err)
    except BaseException:  # noqa: BLE001 — an exception whose __str__ raises anything
        return "(its message cannot be printed: its __str__ raised)"
    return text if type(text) is str else "(unprintable)"


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
            encoder = _Encoder(keep)
            answer: dict[str, Any] = (
                {"callable": True} if value is _CALLABLE else
                {"value": encoder.tree(plain_output(value, label))})
            buffers = encoder.buffers
            answer["sizes"] = [b.nbytes for b in buffers]
        except BaseException as err:  # noqa: BLE001 — whatever the backend raised
            answer, buffers = {"raised": _raised(err)}, []
        finally:
            if os.getpid() != pid:  # a fork of the backend's returned here: it ends
                os._exit(0)
        try:
            conn.send_bytes(json.dumps(answer).encode())
            for data in buffers:
                conn.send_bytes(data)
        except OSError as err:
            print(f"the worker lost its channel to the judge ({err.strerror or err}): the "
                  "backend closed or reused its file descriptor", file=sys.stderr,
                  flush=True)
            os._exit(1)


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
    _let_go_of_the_judges_tracker()
    _without_ptrace()
    _print_into(output)
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
    conn.send_bytes(json.dumps({"backend": described, "unmet": unmet_by_id,
                                "mismatch": mismatch}).encode())
    _serve(conn, backend)


# --- the judge's side


def _rebuilt(raised: Any, name: str) -> BaseException:
    """The exception a backend's call raised, as the judge raises it: NotApplicable and
    the built-in exceptions as themselves (a check may expect a ValueError), a test
    framework's as BackendSteered, any other under its own name."""
    if type(raised) is not dict or not all(type(raised.get(k)) is str
                                           for k in ("type", "module", "message", "at")):
        raise UnreadableAnswer("a malformed exception")
    kind, module, message = raised["type"], raised["module"], raised["message"]
    if raised.get("not_applicable") is True:
        return NotApplicable(message)
    if raised.get("interrupt") is True:
        return BackendInterrupt(f"{name} raised KeyboardInterrupt, with no Ctrl-C or "
                                "SIGTERM received")
    if raised.get("framework") is True:
        return BackendSteered(f"{name} raised {module}.{kind}: a backend cannot reject, skip "
                              "or stop the judge's examples (its error)")
    bases = raised.get("bases")
    if type(bases) is not list:
        raise UnreadableAnswer("a malformed exception")
    name_of = kind.rsplit(".", 1)[-1] or "Exception"
    err: BaseException | None = None
    for base_name in [*bases, "Exception"]:  # the nearest built-in kind it can be made as
        base = getattr(builtins, str(base_name), None)
        if not (isinstance(base, type) and issubclass(base, Exception)):
            continue
        kind_of = base if module == "builtins" and kind == base.__name__ else type(
            name_of, (base,), {"__module__": "backend"})  # its own name, that kind
        try:
            err = kind_of(message)
            break
        except Exception:  # noqa: BLE001, S112 — one that takes other arguments
            continue
    assert err is not None  # Exception(message) always builds
    setattr(err, "backend_frame", raised["at"])  # noqa: B010 — read by runner.run_check
    return err


class Remote(Guarded):
    """An object in the worker's process (the backend itself, or something one of its calls
    returned that is not data), reached only by requests: its attributes, calls, items and
    iteration answer data, or another Remote."""

    def __init__(self, worker: _Worker, handle: int, name: str) -> None:
        self._worker = worker
        self._handle = handle
        self._name = name

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
                if (type(sizes) is not list or len(sizes) > _ARRAYS_LIMIT
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
                raised = _rebuilt(answer["raised"], label)
            else:
                return _decode(answer.get("value"), buffers,
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


def _processes() -> dict[int, tuple[int, str]]:
    """Linux: every process /proc shows, pid → (parent's pid, state); {} where it cannot
    be read."""
    table: dict[int, tuple[int, str]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat:
                state, parent = stat.read().rsplit(")", 1)[1].split()[:2]
            table[int(name)] = (int(parent), state)
        except (OSError, ValueError, IndexError):
            continue
    return table


def _children() -> set[int]:
    """Linux: the pids of this process's children (none where /proc cannot be read)."""
    me = os.getpid()
    return {pid for pid, (parent, _) in _processes().items() if parent == me}


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


ORPHANS_SECONDS = 10.0  # the most _end_orphans spends on what a backend left running


def _end_orphans(before: set[int] | None) -> None:
    """Kill (and reap) every descendant the judge has gained during the run: what a backend
    started and left, which would otherwise outlive the run (and, say, rewrite its report).
    The whole tree at once, stopped before it is killed, so that a chain of processes each
    forking the next cannot stay a step ahead; those the judge had before are left alone."""
    if before is None:
        return
    from multiprocessing import resource_tracker

    me = os.getpid()
    keep = before | {getattr(resource_tracker._resource_tracker, "_pid", None) or -1}
    deadline = time.monotonic() + ORPHANS_SECONDS
    while time.monotonic() < deadline:
        table = _processes()
        below: dict[int, list[int]] = {}
        for pid, (parent, _) in table.items():
            below.setdefault(parent, []).append(pid)
        stray, todo = set(), [p for p in below.get(me, []) if p not in keep]
        while todo:
            pid = todo.pop()
            if pid not in stray:
                stray.add(pid)
                todo.extend(below.get(pid, []))
        if not stray:
            return
        for sig in (signal.SIGSTOP, signal.SIGKILL):  # stopped, none forks any more
            for pid in stray:
                if table[pid][1] != "Z":
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
        for pid in stray:  # the dead become the judge's (its subreaper): reaped
            try:
                os.waitpid(pid, os.WNOHANG)
            except OSError:
                pass
        time.sleep(0.01)


def _undumpable() -> int | None:
    """Linux: make this process (the judge) undumpable, so that processes of the same
    user cannot open its memory or descriptors through /proc or attach to it (with the
    worker's CAP_SYS_PTRACE gone, root's either); the setting before (None: not here)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        before = libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
        if before < 0 or libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
            return None
        return int(before)
    except (OSError, AttributeError):
        return None


def _dumpable_again(before: int | None) -> None:
    if before:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, before, 0, 0, 0)


def _without_ptrace() -> None:
    """Linux: this process (the backend's worker) gives up CAP_SYS_PTRACE for good, in its
    effective, permitted and inheritable sets and, where it may, its bounding set: run as
    root, it could otherwise still read and write the undumpable judge's memory."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(24, 19, 0, 0, 0)  # PR_CAPBSET_DROP CAP_SYS_PTRACE (needs CAP_SETPCAP)
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, self
        data = (ctypes.c_uint32 * 6)()  # {effective, permitted, inheritable} × 2 words
        if libc.capget(header, data) != 0:
            return
        for word in range(3):  # CAP_SYS_PTRACE is bit 19 of the first word
            data[word] &= ~(1 << 19) & 0xFFFFFFFF
        libc.capset(header, data)
    except (OSError, AttributeError):
        pass


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
        self.adopted = _adopt_orphans()
        self.dumpable = _undumpable()
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
        try:
            result = run_check(check, worker.backend, self.precision, self.profile, self.seed,
                               self.timeout, self.save_failures, self.origin, self.plain,
                               self.dtype is not None)
            if not worker.lost:  # what its calls returned, dropped (a finalizer may run)
                try:
                    worker.forget(self.timeout)
                except WorkerLost as err:
                    if result.status in ("pass", "not-applicable"):
                        result.status, result.worst_fraction = "error", None
                        result.detail = str(err)
        finally:
            worker.relay()
        if worker.lost:  # timed out mid-call, died, or its channel is out of step
            if result.status == "error" and "timed out" in result.detail:
                result.detail += " (the worker was stopped)"
            worker.stop()
            self.worker = None
        return result

    def close(self) -> None:
        try:
            if self.worker is not None:
                self.worker.stop()
                self.worker = None
        finally:
            _end_orphans(self.adopted)
            self.adopted = None
            _dumpable_again(self.dumpable)
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
