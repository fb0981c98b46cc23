"""Finding a backend: ``module:attr``, or a name in the ``gptspec.backends`` entry-point
group (the built-in ``torch`` and ``reference`` are registered there too)."""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import entry_points
from typing import Any

from gptspec.conformance.protocol import PROTOCOL_HISTORY, PROTOCOL_VERSION

GROUP = "gptspec.backends"
REQUIRED = ("name", "version", "device", "dtype", "forward")  # and protocol_version


class BackendError(Exception):
    """A backend that cannot be found, built, or does not follow the protocol."""


def registered() -> dict[str, str]:
    """Installed backends: name → ``module:attr``."""
    return {ep.name: ep.value for ep in entry_points(group=GROUP)}


def _resolve(spec: str) -> Any:
    known = registered()
    target = known.get(spec, spec)
    if ":" not in target:
        raise BackendError(f"unknown backend {spec!r}: give module:attr or one of "
                           f"{', '.join(sorted(known)) or '(none installed)'}")
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 — report any import failure in one line
        raise BackendError(f"cannot import backend module {module_name!r}: {err}") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise BackendError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj


def load_backend(spec: str, device: str | None = None, dtype: str | None = None) -> Any:
    """Build the backend named by ``spec``. A class or factory is called with the device
    and dtype it accepts; an object is used as it is."""
    obj = _resolve(spec)
    if callable(obj) and (inspect.isclass(obj) or inspect.isfunction(obj)):
        params = inspect.signature(obj).parameters
        kwargs = {k: v for k, v in (("device", device), ("dtype", dtype))
                  if v is not None and k in params}
        try:
            obj = obj(**kwargs)
        except Exception as err:  # noqa: BLE001
            raise BackendError(f"backend {spec!r} failed to start: "
                               f"{type(err).__name__}: {err}") from None
    check_protocol_version(spec, obj)
    missing = [a for a in REQUIRED if not hasattr(obj, a)]
    if missing:
        raise BackendError(f"backend {spec!r} lacks {', '.join(missing)} "
                           "(see the protocol in gptspec.conformance.protocol)")
    return obj


def check_protocol_version(spec: str, backend: Any) -> None:
    """Refuse a backend written against another protocol version, in one line: its calls
    would take the arguments in another order. No ``protocol_version`` means version 1,
    which predates the attribute."""
    declared = getattr(backend, "protocol_version", 1)
    if declared == PROTOCOL_VERSION:
        return
    ours = f"protocol {PROTOCOL_VERSION} ({PROTOCOL_HISTORY[PROTOCOL_VERSION]})"
    if declared in PROTOCOL_HISTORY:
        theirs = f"protocol {declared} ({PROTOCOL_HISTORY[declared]})"
        if declared < PROTOCOL_VERSION:
            raise BackendError(f"backend {spec!r} speaks conformance {theirs}; this suite "
                               f"speaks {ours}: reorder the arguments and set "
                               f"protocol_version = {PROTOCOL_VERSION}")
    else:
        theirs = f"protocol_version {declared!r}, which this suite does not know"
    raise BackendError(f"backend {spec!r} declares {theirs}; this suite speaks {ours}: "
                       "use the gptspec its protocol came with")
