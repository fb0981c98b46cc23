"""A failing example as files: the exact inputs in an ``.npz`` and a pytest file that
replays them without Hypothesis; and the adjudication of a low-precision failure.

The ``.npz`` holds no pickle, only numeric arrays and strings: a JSON ``manifest`` (the
check, its entries, the message, the backend's target, device and dtype, and the replayed
call: its name, each argument described by kind, ``output_index``), the argument arrays
``a.<n>…`` exactly as the backend received them, and ``expected``, ``bound`` and
``actual`` of the failing comparison (of an ``actual`` far larger, its shape only). Only a
comparison of one backend call's result can be replayed on its own; for a property needing
two calls (causality) the ``.npz`` holds the example's calls and no pytest file is written.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import re
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np

from gptspec.atomic_files import replacing, write_text
from gptspec.conformance import budgets
from gptspec.conformance.context import Call, FailureCapture
from gptspec.conformance.protocol import shown
from gptspec.spec.config import GPTConfig


def _find_compared_call(capture: FailureCapture) -> tuple[Call | None, int | None]:
    """The call whose result (or an element of it) is the compared value."""
    for call in reversed(capture.calls):
        if call.output is capture.actual:
            return call, None
        if isinstance(call.output, (tuple, list)):
            for i, part in enumerate(call.output):
                if part is capture.actual:
                    return call, i
    return None, None


def _encode(value: Any, key: str, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    if value is None:
        return {"none": True}
    if isinstance(value, GPTConfig):
        return {"config": value.to_json()}
    if isinstance(value, np.ndarray):
        arrays[key] = value
        return {"array": key}
    if isinstance(value, dict):
        return {"dict": {k: _encode(v, f"{key}.{k}", arrays) for k, v in value.items()}}
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, np.ndarray) for v in value):
        return {"list": [_encode(v, f"{key}.{i}", arrays)["array"] for i, v in enumerate(value)]}
    if isinstance(value, np.generic):
        return {"value": value.item()}
    if isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise TypeError(f"cannot store an argument of type {type(value).__name__}")


def _decode(encoded: dict[str, Any], data: Any) -> Any:
    if "none" in encoded:
        return None
    if "config" in encoded:
        return GPTConfig.from_json(encoded["config"])
    if "array" in encoded:
        return np.array(data[encoded["array"]])
    if "dict" in encoded:
        return {k: _decode(v, data) for k, v in encoded["dict"].items()}
    if "list" in encoded:
        return [np.array(data[k]) for k in encoded["list"]]
    return encoded["value"]


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_")


def failure_stem(check_id: str, origin: dict[str, Any]) -> str:
    """The name a failure of ``check_id`` is saved under, less its ``test_``, ``_2`` and
    suffix: backend, dtype and check."""
    return _safe(f"{origin.get('name', 'backend')}_{origin.get('dtype', '')}_{check_id}")


def save_failure(directory: str | Path, check_id: str, entries: list[str],
                 capture: FailureCapture, origin: dict[str, Any]) -> list[str]:
    """Write ``<backend>-<dtype>-<check>.npz`` (and a ``test_…py`` when the failure can
    be replayed alone) under ``directory``; return the paths written."""
    directory = Path(directory)
    stem = failure_stem(check_id, origin)
    call, index = _find_compared_call(capture) if capture.comparison is not None else (None, None)
    arrays: dict[str, np.ndarray] = {}
    command = _this_command()
    manifest: dict[str, Any] = {"check": check_id, "entries": entries, "what": capture.what,
                                "message": capture.message, "backend": origin,
                                "replayable": call is not None, "command": command}
    if call is not None:
        manifest.update(call=call.name, output_index=index,
                        args=[_encode(a, f"a.{i}", arrays) for i, a in enumerate(call.args)],
                        kwargs={k: _encode(v, f"k.{k}", arrays) for k, v in call.kwargs.items()})
        arrays["expected"] = np.asarray(capture.expected, dtype=np.float64)
        arrays["bound"] = np.broadcast_to(np.asarray(capture.bound, dtype=np.float64),
                                          arrays["expected"].shape).copy()
        actual = np.asarray(capture.actual)
        if actual.size <= 4 * arrays["expected"].size + 1024:
            arrays["actual"] = actual.astype(np.float64)
        else:  # a broadcast view of 2^40 zeros took hours to compress: its shape says enough
            manifest["actual_unstored"] = (f"the backend's output has shape "
                                           f"{tuple(actual.shape)}, {actual.size:,} values; "
                                           f"the comparison expected "
                                           f"{tuple(arrays['expected'].shape)}")
    else:
        manifest["calls"] = []
        for j, c in enumerate(capture.calls):
            try:
                manifest["calls"].append({
                    "call": c.name,
                    "args": [_encode(a, f"c{j}.{i}", arrays) for i, a in enumerate(c.args)],
                    "kwargs": {k: _encode(v, f"c{j}.k.{k}", arrays) for k, v in c.kwargs.items()}})
            except TypeError as err:
                manifest["calls"].append({"call": c.name, "unstored": str(err)})
    # chosen and written under the folder's lock: another run saving there at once chose
    # the same free name, and the two files were one, holding the second's case
    with _saving_in(directory):
        npz, test = _free_names(directory, stem, command)
        with replacing(npz) as tmp, open(tmp, "wb") as f:
            np.savez_compressed(f, manifest=np.array(json.dumps(manifest)),
                                **arrays)  # type: ignore[arg-type]
        written = [str(npz)]
        if call is not None and origin.get("spec"):
            write_text(test, _pytest_text(check_id, npz.name, origin, capture.message))
            written.append(str(test))
    return written


LOCK_WAIT_S = 60.0  # how long a save waits for another run's save in the same folder


@contextlib.contextmanager
def _saving_in(directory: Path) -> Iterator[None]:
    """Make ``directory`` (and its parents) and hold an exclusive ``flock`` on the folder
    itself while the block runs: a lock file would be one more file left in the user's
    folder, and the kernel releases the lock of a writer that dies. A folder that cannot be
    opened or locked (a file system without ``flock``) is written unlocked, as before."""
    directory.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:  # polled, not blocking: a stopped holder must not hang us
                if time.monotonic() > deadline:
                    raise OSError(f"another run has been saving a failure into {directory} "
                                  f"for {LOCK_WAIT_S:g} s") from None
                time.sleep(0.02)
            except OSError:
                break
        yield
    finally:
        os.close(fd)  # (releases the lock)


_HEADER = '"""Reproduces the conformance failure of '  # how every test file written begins


def _free_names(directory: Path, stem: str, command: str) -> tuple[Path, Path]:
    """``stem``.npz and test_``stem``.py, or with _2, _3, … where either name holds a file
    that is not a saved failure (the user's own, say), one this ``command`` saved (a run
    of another backend of the same name, or on another device) or one a command still
    running saved (another run saving into the folder at the same time, whose "saved:"
    line names it): a failure an earlier, finished command saved is replaced, the rest is
    kept. Called under the folder's lock (``_saving_in``)."""
    def replaceable(path: Path) -> bool:
        saver = _saver(path)
        return saver != command and not _still_running(saver)

    for n in range(1, 1000):
        name = stem if n == 1 else f"{stem}_{n}"
        npz, test = directory / f"{name}.npz", directory / f"test_{name}.py"
        if _ours(npz, replaceable) and _ours(test, _a_saved_test):
            return npz, test
    raise OSError(f"no free name for {stem} in {directory}")


def _this_command() -> str:
    """The gptspec command saving a failure, as its process's pid and start time (pids
    are reused): the judge's own process, where every failure is saved."""
    pid = os.getpid()
    try:
        started = _stat_fields(pid)[19]
    except (OSError, IndexError):
        started = "?"
    return f"{pid}:{started}"


def _stat_fields(pid: int | str) -> list[str]:
    """/proc/PID/stat's fields after the command name: the state first, the start time
    at index 19."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


MANIFEST_LIMIT = 16 * 2**20  # bytes of a manifest read to tell a saved failure's file


def _saver(path: Path) -> object:
    """The command that saved the failure at ``path`` (None where its manifest names none);
    an error where ``path`` is no saved failure. The manifest is read through at most
    MANIFEST_LIMIT bytes: ``np.load`` first allocates what the array's header declares,
    and a foreign file's header declaring 36 TiB raised a MemoryError that lost the save."""
    with zipfile.ZipFile(path) as archive, archive.open("manifest.npy") as member:
        data = member.read(MANIFEST_LIMIT + 1)  # (a KeyError where it has none)
    if len(data) > MANIFEST_LIMIT:
        raise ValueError(f"a manifest of more than {MANIFEST_LIMIT} bytes")
    buffer = io.BytesIO(data)
    version = np.lib.format.read_magic(buffer)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(buffer)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(buffer)
    else:
        raise ValueError(f"a save writes npy format 1.0 or 2.0, not {version}")
    text = buffer.read()
    # one string whose declared size is the bytes there: nothing is allocated beyond them
    if shape != () or dtype.kind != "U" or len(text) != dtype.itemsize:
        raise ValueError("the manifest is not one string")
    manifest = json.loads(str(np.frombuffer(text, dtype=dtype)[0]))
    return manifest.get("command") if isinstance(manifest, dict) else None


def _still_running(command: object) -> bool:
    """Whether the command ``_this_command`` described as ``command`` is still running:
    its pid is a live process (not a zombie) started when it says. Without /proc every
    command reads as finished, as all did before."""
    pid, _, started = str(command).partition(":")
    if not pid.isdigit():
        return False
    try:
        fields = _stat_fields(pid)
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        return True  # cannot tell: keeping its file costs a _2 name, replacing it a case
    return fields[0] != "Z" and started in ("?", fields[19] if len(fields) > 19 else "")


def _a_saved_test(path: Path) -> bool:
    with open(path, encoding="utf-8") as f:
        return f.read(len(_HEADER)) == _HEADER


def _ours(path: Path, is_a_saved_failure: Callable[[Path], bool]) -> bool:
    """Whether ``path`` is free to write: no file there, or a failure saved before."""
    if not path.exists() and not path.is_symlink():
        return True
    try:
        return path.is_file() and bool(is_a_saved_failure(path))
    except Exception:  # noqa: BLE001 — whatever reading it raised (a bad zip, a MemoryError,
        return False  # an unknown compression), a file we cannot read is not ours to replace


def _docstring_text(text: object) -> str:
    """A backend-supplied text inside the generated file's docstring: escaped (shown),
    backslashes doubled and no double quote, so that it cannot end the docstring."""
    return shown(text, 200).replace("\\", "\\\\").replace('"', "'")


def _pytest_text(check_id: str, npz_name: str, origin: dict[str, Any], message: str) -> str:
    first = _docstring_text(message.splitlines()[0] if message else "")
    name, device, dtype = (_docstring_text(origin.get(k)) for k in ("name", "device", "dtype"))
    return f'''"""Reproduces the conformance failure of {check_id} on {name}
({device}, {dtype}) without Hypothesis: the backend's call on the
saved inputs, compared with the saved float64 reference within the saved budget.

Failure when written: {first}
Generated by `gptspec conformance --save-failures`; run with `pytest {{this file}}`.
"""

from pathlib import Path

from gptspec.conformance.reproduction import replay

CASE = Path(__file__).with_name({npz_name!r})


def test_{_safe(check_id)}():
    comparison = replay(CASE)
    assert comparison.passed, comparison.describe()
'''


def load_case(path: str | Path) -> tuple[dict[str, Any], Any]:
    """The manifest and arrays of a saved failure."""
    data = np.load(path, allow_pickle=False)
    return json.loads(str(data["manifest"])), data


def replay(path: str | Path, backend: Any = None) -> budgets.Comparison:
    """Call the backend (by default the one named in the file) on the saved inputs and
    compare with the saved reference and budget."""
    from gptspec.conformance.discovery import load_backend

    manifest, data = load_case(path)
    if not manifest.get("replayable"):
        raise ValueError(f"{path}: this failure needs several calls; rerun its check instead")
    if backend is None:
        origin = manifest["backend"]
        backend = load_backend(origin["spec"], device=origin.get("device"),
                               dtype=origin.get("dtype"))
    args = [_decode(a, data) for a in manifest["args"]]
    kwargs = {k: _decode(v, data) for k, v in manifest["kwargs"].items()}
    out = getattr(backend, manifest["call"])(*args, **kwargs)
    if manifest["output_index"] is not None:
        out = out[manifest["output_index"]]
    return budgets.compare(out, np.array(data["expected"]), np.array(data["bound"]))


# --- adjudication ------------------------------------------------------------------------------


def adjudicable(capture: FailureCapture, dtype: str, plain_spec: str | None) -> bool:
    """Whether ``adjudicate`` would weigh this failure: a plain implementation is named, the
    dtype is a low precision one, and the failure is a comparison that exceeded its budget
    (not a wrong shape, a NaN or a property)."""
    return (plain_spec is not None and dtype != "float64" and capture.comparison is not None
            and not capture.comparison.problem)


def _end_if_forked(pid: int) -> None:
    if os.getpid() != pid:
        os._exit(0)


def _implementation(backend: Any) -> str:
    """A backend's class, by name: for an object in a worker (isolation.Remote), the class
    of the one it stands for there."""
    own = vars(backend) if hasattr(backend, "__dict__") else {}
    if own.get("_class"):
        return str(own["_class"])
    kind = type(own.get("_wrapped", backend))
    return f"{kind.__module__}.{kind.__qualname__}"


def adjudicate(capture: FailureCapture, backend: Any, dtype: str,
               plain_spec: str | None,
               build: Callable[[str, str], AbstractContextManager[Any]] | None = None,
               ) -> dict[str, Any] | None:
    """When a low-precision backend exceeds its budget, the same call on a plain
    same-dtype implementation, measured against the same float64 reference and budget:
    which of the two is closer? ``plain_spec`` names that implementation as discovery does
    (the command line passes the built-in ``torch``), built on the CPU in ``dtype`` by
    ``build`` (default: loaded in this process; an isolated judge builds it in a worker of
    its own, as it builds the backend); the judge itself knows no backend. None: no
    adjudication (see ``adjudicable``)."""
    if not adjudicable(capture, dtype, plain_spec):
        return None
    assert plain_spec is not None and capture.comparison is not None  # adjudicable says so
    call, index = _find_compared_call(capture)
    if call is None:
        return None
    from gptspec.conformance.discovery import BackendError, _what_raised, load_backend
    from gptspec.conformance.protocol import CheckTimeout

    # whatever the plain one raises is its own: a SystemExit(0) from it ended a --no-isolate
    # run with status 0 and no verdict, a BaseException of its own in a traceback
    with contextlib.ExitStack() as ending:
        # a fork of the plain one's (in this process: --no-isolate) returns no further
        ending.callback(_end_if_forked, os.getpid())
        try:
            plain = (ending.enter_context(build(plain_spec, dtype)) if build is not None
                     else load_backend(plain_spec, device="cpu", dtype=dtype))
            plain_name = f"{plain.name} cpu {dtype}"
        except (KeyboardInterrupt, CheckTimeout):
            raise
        except BaseException as err:  # noqa: BLE001 — e.g. its engine is not installed here
            return {"plain": f"{plain_spec} cpu {dtype}",
                    "note": "could not build it: "
                            f"{err if isinstance(err, BackendError) else _what_raised(err)}"}
        if _implementation(backend) == _implementation(plain) and backend.device == "cpu":
            return {"plain": plain_name,
                    "note": "the backend is the plain implementation itself"}
        try:
            out = getattr(plain, call.name)(*call.args, **call.kwargs)
            if index is not None:
                out = out[index]
            theirs = budgets.compare(out, capture.expected, capture.bound)
        except (KeyboardInterrupt, CheckTimeout):
            raise
        except BaseException as err:  # noqa: BLE001 — the plain one may lack or refuse it
            return {"plain": plain_name, "note": f"could not run it: {_what_raised(err)}"}
    ours = capture.comparison.fraction
    closer = "backend" if ours < theirs.fraction else "plain"
    return {"plain": plain_name, "backend_fraction": ours, "plain_fraction": theirs.fraction,
            "closer": closer,
            "note": (f"the plain {plain_name} implementation is at "
                     f"{100 * theirs.fraction:.3g}% of budget on the same input, the backend at "
                     f"{100 * ours:.3g}%: the {'backend' if closer == 'backend' else 'plain one'}"
                     " is closer to the float64 reference")}
