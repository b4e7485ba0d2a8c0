"""Decorators that dispatch a forward to another implementation, resolved the way they resolve it.

A class decorator such as `transformers`' `use_experts_implementation` replaces a module's
`forward` with one that looks up, at each call, the function that really runs for the current
configuration (`config._experts_implementation`: "grouped_mm", "batched_mm", "eager", ...) and calls
it with the module. Re-applying such a wrapper around the schema would run that implementation live
(the schema of the original forward is never entered), so for a dispatcher this module knows, the
parser resolves the implementation exactly as the wrapper would and lowers *that* function as the
block's body, with the module as `self`. A `Dispatch` keeps how to resolve it again: the generated
code checks at each call that the wrapper would still pick the same function, and refuses with a
StaleSchemaError naming the setting when it would not (the configuration changed after parsing).

A dispatching wrapper this module does not know is left as a wrapper; the parser's live-call
detector reports its implementation as running live (kind "dispatch").

Depends on the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

__all__ = ["Dispatch", "known_dispatch"]


@dataclass(frozen=True)
class Dispatch:
    """`resolve(module)` is the function the wrapper calls now; `chosen` the one lowered; `setting`
    names what decides it (for messages), `value(module)` reads that setting."""

    resolve: Callable[[Any], Any]
    chosen: Any
    setting: str
    value: Callable[[Any], Any]


def _closure(fn: Any) -> dict:
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    if code is None:
        return {}
    out = {}
    for name, cell in zip(code.co_freevars, cells):
        try:
            out[name] = cell.cell_contents
        except ValueError:
            pass
    return out


def _experts_implementation(wrapper: Any, module: Any) -> Optional[Dispatch]:
    """transformers' `use_experts_implementation`: `experts_interface.get_interface(
    self.config._experts_implementation, original_forward)`."""
    code = getattr(wrapper, "__code__", None)  # `functools.wraps` copied the original's names onto it
    if code is None or not getattr(code, "co_qualname", "").endswith(
            "use_experts_implementation.<locals>.wrapper.<locals>.forward"):
        return None
    cells = _closure(wrapper)
    interface, original = cells.get("experts_interface"), cells.get("original_forward")
    get = getattr(interface, "get_interface", None)
    config = getattr(module, "config", None)
    if get is None or original is None or config is None:
        return None

    def value(mod: Any) -> Any:
        return mod.config._experts_implementation

    def resolve(mod: Any) -> Any:
        return get(mod.config._experts_implementation, original)

    try:
        chosen = resolve(module)
    except Exception:  # an invalid setting: eager raises the same at its first call
        return None
    return Dispatch(resolve=resolve, chosen=chosen, setting="config._experts_implementation", value=value)


_KNOWN = (_experts_implementation,)


def known_dispatch(wrapper: Any, module: Any) -> Optional[Dispatch]:
    """The Dispatch of `wrapper` (a module's decorated forward) when it is a dispatcher we know."""
    for probe in _KNOWN:
        found = probe(wrapper, module)
        if found is not None:
            return found
    return None
