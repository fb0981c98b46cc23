"""Finding a backend: ``module:attr``, or a name in the ``gptspec.backends`` entry-point
group (the built-in ``torch`` and ``reference`` are registered there too)."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import numbers
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from gptspec.conformance.protocol import (
    PROTOCOL_HISTORY,
    PROTOCOL_VERSION,
    CheckTimeout,
    NotApplicable,
    capability_problem,
    shown,
)

GROUP = "gptspec.backends"
REQUIRED = ("name", "version", "device", "dtype", "forward")  # and protocol_version;
# forward only of a backend with a model (protocol.CAPABILITIES: declared, or none declared)


class BackendError(Exception):
    """A backend that cannot be found, built, or does not follow the protocol."""


class BackendRefused(BackendError):
    """A backend that declined, while being built, the dtype or device asked (its
    constructor raised NotApplicable): the run is recorded as refused, with the reason."""

    def __init__(self, target: str, reason: str) -> None:
        super().__init__(f"backend {target!r} refused: {reason}")
        self.reason = reason


def registered() -> dict[str, str]:
    """Installed backends: name → ``module:attr``."""
    return {ep.name: ep.value for ep in entry_points(group=GROUP)}


def _target(target: str) -> tuple[str, str]:
    """``target``'s module and attribute, an installed name read as what it names."""
    known = registered()
    module_attr = known.get(target, target)
    if ":" not in module_attr:
        raise BackendError(f"unknown backend {target!r}: give module:attr or one of "
                           f"{', '.join(sorted(known)) or '(none installed)'}")
    module_name, _, attr = module_attr.partition(":")
    return module_name, attr


def locate(target: str) -> str | None:
    """Raise BackendError, in one line, when ``target`` names a module that does not exist,
    without running any of its code (the backend may only run isolated): each package
    on the way is looked up on its parent's path, not imported. Returns the module's file
    where it has one."""
    module_name, _ = _target(target)
    parts = module_name.split(".")
    if not all(part.isidentifier() for part in parts):
        raise BackendError(f"{module_name!r} is not a module name")
    try:
        found = importlib.util.find_spec(parts[0])
        for depth in range(1, len(parts)):
            if found is None or found.submodule_search_locations is None:
                break
            found = importlib.machinery.PathFinder.find_spec(
                ".".join(parts[: depth + 1]), list(found.submodule_search_locations))
    except (ImportError, ValueError, OSError):
        return None  # the import, when the run makes it, says what is wrong
    if found is None:
        raise BackendError(f"cannot import backend module {module_name!r}: no module named "
                           f"{module_name!r}")
    return found.origin if found.has_location else None


def _resolve(target: str) -> Any:
    module_name, attr = _target(target)
    try:
        module = importlib.import_module(module_name)
    except (KeyboardInterrupt, CheckTimeout):
        raise
    except BaseException as err:  # noqa: BLE001 — any import failure, in one line
        # SystemExit too: a module calling sys.exit(0) on import must not end the run as
        # if every check had passed; and a BaseException of its own
        raise BackendError(f"cannot import backend module {module_name!r}: "
                           f"{_what_raised(err)}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise BackendError(f"module {module_name!r} has no attribute {attr!r}") from None
        except Exception as err:  # noqa: BLE001 — a module __getattr__ may raise anything
            raise BackendError(f"backend {target!r}: looking up {part!r} raised "
                               f"{_what_raised(err)}") from None
    return obj


def _repr(value: object) -> str:
    """``repr(value)`` as the judge shows a backend's string; a repr that raises (an int of
    more digits than Python prints, a hostile ``__repr__``) is named, not raised."""
    try:
        return shown(repr(value))
    except (Exception, SystemExit):  # noqa: BLE001
        return f"(a value of type {shown(type(value).__name__)} that cannot be printed)"


def _what_raised(err: BaseException) -> str:
    if isinstance(err, SystemExit):
        return f"it called exit({_repr(err.code)})"
    message = shown(err)  # "(unprintable)" where its __str__ raises
    return f"{shown(type(err).__name__)}: {message}" if message else shown(type(err).__name__)


def load_backend(target: str, device: str | None = None, dtype: str | None = None) -> Any:
    """Build the backend named by ``target``. A class or factory is called with the device
    and dtype it accepts (by name, or through ``**options``); an object is used as it is."""
    obj = _resolve(target)
    if callable(obj) and (inspect.isclass(obj) or inspect.isfunction(obj)):
        params = inspect.signature(obj).parameters
        kwargs = {k: v for k, v in (("device", device), ("dtype", dtype))
                  if v is not None and _takes(params, k)}
        try:
            obj = obj(**kwargs)
        except NotApplicable as err:  # it declines the dtype or device asked, in one line
            raise BackendRefused(target, shown(err)) from None
        except (KeyboardInterrupt, CheckTimeout):
            raise
        except BaseException as err:  # noqa: BLE001 — SystemExit, a BaseException of its own
            raise BackendError(f"backend {target!r} failed to start: {_what_raised(err)}"
                               ) from None
        if obj is None:  # a factory that forgot its return: no protocol version to speak of
            raise BackendError(f"backend factory {target!r} returned None, not a backend")
    try:
        declared = getattr(obj, "capabilities", None)
    except Exception as err:  # noqa: BLE001
        raise BackendError(f"backend {target!r}: reading its 'capabilities' raised "
                           f"{_what_raised(err)}") from None
    problem = "" if declared is None else capability_problem(declared)
    if problem:
        raise BackendError(f"backend {target!r}: {problem}")
    required = [a for a in REQUIRED
                if a != "forward" or declared is None or "model" in declared]
    missing = []
    for attribute in ("protocol_version", *required):  # read once here, where a raising
        try:                                            # property is the backend's fault
            getattr(obj, attribute)
        except AttributeError:
            missing.append(attribute)
        except Exception as err:  # noqa: BLE001
            raise BackendError(f"backend {target!r}: reading its {attribute!r} raised "
                               f"{_what_raised(err)}") from None
    if not (set(REQUIRED) - set(missing)):  # none of a backend's attributes: no backend,
        kind = shown(type(obj).__name__)     # whatever the version of its protocol
        raise BackendError(f"backend {target!r} is an object of type {kind}, not a backend "
                           f"(it has none of {', '.join(REQUIRED)})")
    lacks = [a for a in missing if a != "protocol_version"]
    if not lacks or "protocol_version" not in missing:
        # a backend of another version has every attribute but that one; an object with
        # only some (builtins:exit has a name) is no backend of any version
        check_protocol_version(target, obj)
    missing = lacks
    if missing:
        raise BackendError(f"backend {target!r} lacks {', '.join(missing)} "
                           "(see the protocol in gptspec.conformance.protocol)")
    from gptspec.conformance.budgets import Precision

    try:  # the dtype the budgets are derived for
        Precision.of(str(obj.dtype))
    except ValueError as err:
        raise BackendError(f"backend {target!r}: {err}") from None
    return obj


def _takes(params: Mapping[str, inspect.Parameter], name: str) -> bool:
    """Whether a call may pass ``name=``: a parameter of that name, or ``**options``."""
    own = params.get(name)
    if own is not None and own.kind is not own.POSITIONAL_ONLY:
        return True
    return any(p.kind is p.VAR_KEYWORD for p in params.values())


def check_protocol_version(target: str, backend: Any) -> None:
    """Refuse a backend written against another protocol version, in one line: its calls
    would take the arguments in another order. No ``protocol_version`` means version 1,
    which predates the attribute."""
    declared = getattr(backend, "protocol_version", 1)
    # a number, compared as one: True is not version 1, nor an array or an object whose
    # __eq__ says anything version 2
    number = isinstance(declared, numbers.Real) and not isinstance(declared, bool)
    if number and declared == PROTOCOL_VERSION:
        return
    ours = f"protocol {PROTOCOL_VERSION} ({PROTOCOL_HISTORY[PROTOCOL_VERSION]})"
    if number and declared in PROTOCOL_HISTORY:
        theirs = f"protocol {int(declared)} ({PROTOCOL_HISTORY[int(declared)]})"
        if declared < PROTOCOL_VERSION:
            raise BackendError(f"backend {target!r} speaks conformance {theirs}; this suite "
                               f"speaks {ours}: reorder the arguments and set "
                               f"protocol_version = {PROTOCOL_VERSION}")
    else:
        theirs = f"protocol_version {_repr(declared)}, which this suite does not know"
    raise BackendError(f"backend {target!r} declares {theirs}; this suite speaks {ours}: "
                       "use the gptspec its protocol came with")
