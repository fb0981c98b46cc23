"""Which entries an entry is built from, read from its sympy form.

An entry's meaning is a sympy function, and a composite one calls the entries it is made
of (``causal_mask.sympy(T)``), directly or through a module's helper (the block's
``_attention``). Following the names the function's code refers to, through helpers but
not into other entries, gives the entries it uses: the definition itself, so the links
between pages cannot disagree with it and no list has to be kept by hand.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable
from typing import Any


def _codes(code: types.CodeType) -> Iterable[types.CodeType]:
    """A code object and those nested in it (comprehensions, lambdas, inner functions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _is_entry(value: Any) -> bool:
    return callable(getattr(value, "sympy", None)) and isinstance(getattr(value, "id", None), str)


def entries_used(entry: Any, is_spec_module: Callable[[str], bool] | None = None) -> list[str]:
    """The ids of the entries that ``entry``'s sympy form calls, in first-use order.

    ``is_spec_module(name)`` says which modules' helpers to follow (default: the spec's,
    ``gptspec.spec.*``); functions elsewhere (sympy's) are not entries' definitions."""
    def in_spec(name: str) -> bool:
        return is_spec_module(name) if is_spec_module else name.startswith("gptspec.spec")

    found: list[str] = []
    seen: set[int] = set()

    def visit(function: Any) -> None:
        function = getattr(function, "__wrapped__", function)
        code = getattr(function, "__code__", None)
        if code is None or id(code) in seen:
            return
        seen.add(id(code))
        names = getattr(function, "__globals__", {})
        for c in _codes(code):
            for name in c.co_names:
                value = names.get(name)
                if isinstance(value, dict | tuple | list):  # a table of entries to pick from
                    for item in (value.values() if isinstance(value, dict) else value):
                        if _is_entry(item) and item.id != entry.id and item.id not in found:
                            found.append(item.id)
                        elif isinstance(item, types.FunctionType) \
                                and in_spec(item.__module__ or ""):
                            visit(item)
                elif _is_entry(value):
                    if value.id != entry.id and value.id not in found:
                        found.append(value.id)
                elif isinstance(value, types.ModuleType) and in_spec(value.__name__):
                    # module.entry.sympy(...): the attribute names are in co_names too
                    for attr in c.co_names:
                        target = getattr(value, attr, None)
                        if _is_entry(target) and target.id != entry.id \
                                and target.id not in found:
                            found.append(target.id)
                elif isinstance(value, types.FunctionType) and in_spec(value.__module__ or ""):
                    visit(value)

    visit(entry.sympy)
    return found
