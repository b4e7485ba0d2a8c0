"""Where a module that is no sub-module came from: the words of a live call's reason.

A forward can call a module the model never registered: one held in a plain dict or list
attribute (`self.table = {"act": nn.GELU()}`), set past `nn.Module.__setattr__` after the parse
(one there at parse time has a block: `parser.special_modules.held_modules`), a module-level instance or registry
(`ACTS["silu"]`), or one built at each call (transformers' `ACT2FN[name]`, torchdiffeq's
`_PerturbFunc` inside `odeint`). Such a module has no block and runs as the real module; the
live-call detector (`coverage`) reports it, and `how_reached` says which of these it was, by
looking (once per reported region) at what the calling module and its forward's module hold.

Depends on torch only.
"""

from __future__ import annotations

import inspect
import types
from typing import Any, Optional

from torch import nn

__all__ = ["how_reached", "forward_globals"]

_MAX_ITEMS = 256  # entries of one dict / list looked at


def _in_container(value: Any, target: Any) -> Optional[str]:
    """`[key]` when `target` is an item of the dict, list or tuple `value` (one level)."""
    if isinstance(value, dict):
        for index, (key, item) in enumerate(value.items()):
            if index >= _MAX_ITEMS:
                break
            if item is target:
                return f"[{key!r}]"
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value[:_MAX_ITEMS]):
            if item is target:
                return f"[{index}]"
    return None


def forward_globals(owner: Any) -> Optional[dict]:
    """The module-level globals of `owner`'s class forward (what its names resolve in)."""
    function = inspect.getattr_static(type(owner), "forward", None)
    function = getattr(function, "__func__", function)
    seen = 0
    while isinstance(function, types.FunctionType) and "__wrapped__" in function.__dict__ and seen < 16:
        function = function.__dict__["__wrapped__"]
        seen += 1
    return getattr(function, "__globals__", None)


def how_reached(module: nn.Module, owner: Any, via: str = "", callers: tuple = ()) -> str:
    """How `module` (no sub-module) was reached from the forward of `owner` (the module whose
    interpreted forward made the call that led there), in words for a coverage reason. `callers`:
    the live modules between the two (innermost first), themselves no sub-modules: `module` may be
    a sub-module of one of them (`self.original_model(x)` running the layers it holds)."""
    for caller in callers:
        for index, (name, child) in enumerate(caller.named_modules()):
            if index > 4096:
                break
            if child is module and name:
                return f"the sub-module {name} of a {type(caller).__name__}, which is itself no sub-module"
    if owner is not None:
        state = getattr(owner, "__dict__", {})
        for attr, value in state.items():
            if attr in ("_modules", "_parameters", "_buffers") or attr.startswith("_forward") or \
                    attr.startswith("_backward") or attr.startswith("_state_dict") or attr.startswith("_load_"):
                continue
            if value is module:
                return f"held as the plain attribute self.{attr}, set past nn.Module's registration"
            index = _in_container(value, module)
            if index is not None:
                return f"held in the {type(value).__name__} attribute self.{attr}{index}"
        names = forward_globals(owner) or {}
        home = names.get("__name__", "")
        for name, value in list(names.items()):
            if value is module:
                return f"the module-level global {home}.{name}" if home else f"the global {name}"
            index = _in_container(value, module)
            if index is not None:
                where = f"{home}.{name}" if home else name
                return f"held in the module-level {type(value).__name__} {where}{index}"
    made = f" (e.g. built inside {via})" if via else \
        " (e.g. a registry that builds a module per lookup, as transformers' ACT2FN does)"
    return f"made at run time or reached through other objects, held by no attribute or global of the caller{made}"
