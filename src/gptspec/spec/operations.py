"""The optional operations a backend may expose for the model, and how it exposes them.

Each forward-area spec entry (groups embedding, attention, block, output) but the whole
model is an operation a backend may provide under its reference function's name and
signature (gptspec.conformance.protocol), read from the registry so that no list needs
editing; ``gpt_forward`` is the protocol's ``forward``, not an optional operation.

:class:`OptionalOperations` is the plumbing a backend built on one module of such
functions needs, written once: ``implemented_ops()``, the operations as attributes, and
``dir()``. Spec-level so that every backend can use it (the built-in one imports nothing
above spec and reference; gptspec.adapters.kit re-exports it for adapter authors).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

FORWARD_GROUPS = ("embedding", "attention", "block", "output")


def forward_operations() -> tuple[str, ...]:
    """Every optional operation of the model, in the registry's reading order."""
    from gptspec.spec import REGISTRY

    return tuple(e.id for e in REGISTRY if e.group in FORWARD_GROUPS and e.id != "gpt_forward")


def operations_in(namespace: Mapping[str, Any]) -> list[str]:
    """The optional operations a module defines (``operations_in(globals())`` at its end):
    its ``__all__``, with no list of names to keep in step with the spec."""
    return [name for name in forward_operations() if callable(namespace.get(name))]


class OptionalOperations:
    """A backend's optional operations as attributes. A subclass sets ``OPERATIONS`` (the
    names it implements, usually ``operations_in(vars(its_ops_module))``) and defines
    ``_operation(name)``, the callable with the reference function's signature; a name
    outside ``OPERATIONS`` is an AttributeError, which the suite reports as not
    implemented."""

    OPERATIONS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def implemented_ops(cls) -> list[str]:
        """The reference functions this backend implements, by name."""
        return list(cls.OPERATIONS)

    def _operation(self, name: str) -> Callable[..., Any]:
        raise NotImplementedError(f"{type(self).__name__} defines no _operation")

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name in type(self).OPERATIONS:
            return self._operation(name)
        raise AttributeError(f"{type(self).__name__} has no attribute or operation {name!r}")

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(type(self).OPERATIONS))
