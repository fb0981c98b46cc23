"""The worker's answers on the wire: what a backend's call returned, or raised, as a JSON
header and the raw bytes of the arrays it names, read by the judge as data and nothing
else. (The judge's requests go the other way as pickles: the worker trusts its judge.)

A backend that writes into the channel can therefore only misstate its own results,
which the judge compares like any other; an answer in any form but those ``Encoder``
writes is ``UnreadableAnswer``, and the judge treats the worker as lost.
"""

from __future__ import annotations

import builtins
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
)
from gptspec.conformance.protocol import NotApplicable, shown

HEADER_LIMIT = 16 << 20  # bytes of one answer's JSON header
ANSWER_LIMIT = 4 << 30  # bytes of the arrays of one answer, all together
_ARRAY_KINDS = "biufc"  # bool, signed and unsigned integers, floats, complex numbers
ARRAYS_LIMIT = 1 << 20  # arrays in one answer
_DEPTH = 70  # levels of containers in one answer (plain_output allows 64)
INT_BITS = 1024  # the widest Python int an answer holds (JSON's text of it stays short)


class Encoder:
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
        if self.size > ANSWER_LIMIT:
            raise UnreadableOutput(f"returned more than {ANSWER_LIMIT >> 30} GiB of arrays")
        if len(self.buffers) >= ARRAYS_LIMIT:
            raise UnreadableOutput(f"returned more than {ARRAYS_LIMIT} arrays or NumPy "
                                   "scalars")
        # (np.ascontiguousarray would make a 0-d array 1-d)
        data = value if value.flags.c_contiguous else value.copy(order="C")
        self.buffers.append(data.reshape(-1).view(np.uint8))
        return ["array", len(self.buffers) - 1, data.dtype.str, list(data.shape)]

    def numbers(self, items: list[Any] | tuple[Any, ...]) -> list[Any] | None:
        """A list or tuple of numbers of one type (Python floats, Python ints that fit 64
        bits, or NumPy scalars of one dtype) as one array: logits returned as nested
        lists, or token ids, cross as a few buffers rather than text or one frame per
        number. None: not such a sequence."""
        if not items:
            return None
        kind = type(items[0])
        if not all(type(v) is kind for v in items):
            return None
        try:
            if kind is float:
                return ["float", self.array(np.array(items, dtype=np.float64))]
            if kind is int:
                return ["int", self.array(np.array(items, dtype=np.int64))]
        except OverflowError:  # ints past 64 bits: one by one
            return None
        if issubclass(kind, np.generic):
            dtype = items[0].dtype
            if dtype.kind in _ARRAY_KINDS and all(v.dtype == dtype for v in items):
                return ["scalar", self.array(np.array(items, dtype=dtype))]
        return None

    def tree(self, value: Any) -> Any:
        if value is None or type(value) in (bool, str):
            return value
        if type(value) is int:
            if value.bit_length() > INT_BITS:
                raise UnreadableOutput(f"returned an integer of more than {INT_BITS} bits")
            return value
        if type(value) is float:
            return value if np.isfinite(value) else ["float", repr(value)]
        if type(value) is complex:
            return ["complex", self.tree(value.real), self.tree(value.imag)]
        if type(value) is bytes:
            return ["bytes", value.hex()]
        if type(value) in (list, tuple):
            numbers = self.numbers(value)
            if numbers is not None:
                return ["numbers", type(value).__name__, *numbers]
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


def decode(tree: Any, buffers: list[bytearray], remote: Callable[[int], Any],
            depth: int = 0) -> Any:
    """The judge's reading of an answer: only the forms Encoder writes."""
    if depth > _DEPTH:
        raise UnreadableAnswer("nested too deeply")
    if tree is None or type(tree) in (bool, int, float, str):
        return tree
    if type(tree) is not list or not tree or type(tree[0]) is not str:
        raise UnreadableAnswer(f"an unknown form {type(tree).__name__}")
    kind, args = tree[0], tree[1:]

    def inner(x: Any) -> Any:
        return decode(x, buffers, remote, depth + 1)

    if kind == "float" and len(args) == 1 and args[0] in ("nan", "inf", "-inf"):
        return float(args[0])
    if kind == "complex" and len(args) == 2:
        real, imag = inner(args[0]), inner(args[1])
        if type(real) is not float or type(imag) is not float:
            raise UnreadableAnswer("a complex number of no floats")
        return complex(real, imag)
    if kind == "bytes" and len(args) == 1 and type(args[0]) is str:
        return bytes.fromhex(args[0])
    if kind == "numbers" and len(args) == 3 and args[0] in ("list", "tuple"):
        array = inner(args[2])
        if type(array) is not np.ndarray or array.ndim != 1 or not len(array):
            raise UnreadableAnswer("numbers of no 1-d array")
        if args[1] == "float" and array.dtype == np.float64:
            items = array.tolist()
        elif args[1] == "int" and array.dtype == np.int64:
            items = array.tolist()
        elif args[1] == "scalar":
            items = list(array)
        else:
            raise UnreadableAnswer(f"numbers of an unknown kind {args[1]!r}")
        return items if args[0] == "list" else tuple(items)
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


# --- what a call raised


def encode_raised(err: BaseException) -> dict[str, Any]:
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
    try:  # (as discovery says it of a backend in the judge's process)
        text = f"it called exit({err.code!r})" if isinstance(err, SystemExit) else str(err)
    except BaseException:  # noqa: BLE001 — an exception whose __str__ raises anything
        return "(its message cannot be printed: its __str__ raised)"
    return text if type(text) is str else "(unprintable)"


def decode_raised(raised: Any, name: str) -> BaseException:
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
