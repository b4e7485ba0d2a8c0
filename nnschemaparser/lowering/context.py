"""What one lowering may look at (`LoweringContext`) and the method schemas it asks for (`MethodRequest`).

Shared by `expressions`, `calls` and `statements`, so none imports another for these. Depends on the
schema's `Binding` only.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..schema.model import Binding

__all__ = ["MethodRequest", "LoweringContext"]


@dataclass(frozen=True)
class MethodRequest:
    """A method schema the lowered code calls: `key` in the block at `path` runs `function`."""

    path: str
    key: str
    function: Callable
    owner: Optional[type]
    # True when the forward reads the method as a value (`self.feed_forward_chunk` passed to a
    # helper that calls it): the runtime lends the instance the schema under that name for a run.
    as_value: bool = False
    # Set for the `__call__` of a plain object the module holds (`self.processor(self, x)`, a
    # diffusers attention processor): the method's `self` is that attribute of the module.
    self_attr: Optional[str] = None
    # Set for a cached function the code calls by a global or closure name (`_freqs(n)` under
    # `functools.cache`): where the name is read at each call; the schema has no `self` for it.
    binding: Optional[Binding] = None


@dataclass
class LoweringContext:
    """What the lowering may look at: the function's globals and closure, and the live module."""

    globals: dict[str, Any]
    closure: dict[str, Any] = field(default_factory=dict)
    cells: dict[str, Any] = field(default_factory=dict)  # the closure's cells, by name
    # The lowered function's own defaults (`__defaults__`, `__kwdefaults__`): Python evaluated them
    # once, at `def` time, so the schema takes those objects rather than re-evaluating the source.
    defaults: Optional[tuple] = None
    kwdefaults: Optional[dict] = None
    module: Any = None
    owner: Optional[type] = None
    requests: list[MethodRequest] = field(default_factory=list)

    def binding_of(self, name: str, value: Any) -> Optional[Binding]:
        """Where `name` (just resolved to `value`) lives: a closure cell or a module global; None
        for a builtin (the runtime does not follow rebinding builtins)."""
        if name in self.closure and name in self.cells:
            return Binding(text=name, kind="closure", namespace=self.cells[name], key=name, value=value)
        if name in self.globals:
            return Binding(text=name, kind="global", namespace=self.globals, key=name, value=value)
        return None

    def resolve_global(self, name: str) -> tuple[bool, Any]:
        if name in self.closure:
            return True, self.closure[name]
        if name in self.globals:
            return True, self.globals[name]
        builtin_ns = self.globals.get("__builtins__", builtins)
        if isinstance(builtin_ns, dict):
            if name in builtin_ns:
                return True, builtin_ns[name]
        elif hasattr(builtin_ns, name):
            return True, getattr(builtin_ns, name)
        return False, None
