"""How generated code reads names: a global, closure cell or attribute chain where the source reads it, and the guard at the top.

`ReadEmitters` is a part of `codegen.CodeGenerator` (a base class of it), kept in a module of its
own: `bound_const` writes the live read of a name the instruction reads (a global, a closure cell,
a chain rooted at one), `guard_lines` the check, at the top of a function, that the forward it was
lowered from is still its class's.

Depends on the schema, `instructions` and `functions`.
"""

from __future__ import annotations

import functools
import keyword
from typing import Any

from ..schema.model import Binding
from .functions import GUARD_ERRORS, guard_failed, read_cell, read_global, stale_dispatch, stale_method
from .instructions import quote

__all__ = ["ReadEmitters"]


class ReadEmitters:
    """Live reads of names and the function's guard (a base class of `CodeGenerator`)."""

    def bound_const(self, value: Any, binding: Binding, base: str) -> str:
        """Source reading `binding` (a global, a closure cell, a chain rooted at one) where the
        instruction reads it, as CPython reads the name there: a helper or a branch that rebinds it
        earlier in the same run (`MODE = 2`, `Rotary._cache = ...`, a kernel library's patch) is seen
        by every later read, a global deleted since is Python's NameError. The read is a plain
        subscript of the function's globals dict (or the cell's `cell_contents`) followed by the
        chain's attribute loads: what CPython's own LOAD_GLOBAL / LOAD_DEREF + LOAD_ATTR do. Inside
        a `try` with handlers it goes through `functions.read_global` / `read_cell`, so the handlers
        see the NameError itself."""
        space = self.helper_name(f"namespace {id(binding.namespace)}", lambda: self.const(
            binding.namespace, "globals" if binding.kind == "global" else "cell"))
        if self.handled:
            reader = read_cell if binding.kind == "closure" else read_global
            read = f"{self.helper(reader.__name__, reader)}({space}, {quote(binding.key)})"
        elif binding.kind == "closure":
            read = f"{space}.cell_contents"
        else:
            read = f"{space}[{quote(binding.key)}]"
        for attr in binding.attrs:
            if attr.isidentifier() and not keyword.iskeyword(attr):
                read = f"{read}.{attr}"
            else:
                read = f"{self.helper('getattr', getattr)}({read}, {quote(attr)})"
        return read

    def guard_lines(self) -> None:
        """The check, at the top of the function, that the forward (or method) it was lowered from
        is still its class's (else StaleSchemaError), and that a dispatching decorator still picks
        the implementation lowered. Names the body reads are not checked here: each read is live
        (`bound_const`)."""
        lines = []
        parsed = getattr(self.unit, "parsed_from", None)
        if parsed is not None:
            owner, attr, function = parsed
            stale = functools.partial(stale_method, owner, attr, function, self.unit.label)
            lines.append(f"if {self.const(owner.__dict__, 'class_dict')}[{quote(attr)}] is not "
                         f"{self.const(function, 'parsed')}: {self.const(stale, 'stale')}()")
            failed = self.const(functools.partial(guard_failed, parsed, stale), "guard_failed")
            self.line("    try:", None)
            for text in lines:
                self.line("        " + text, None)
            self.line(f"    except {self.helper('GUARD_ERRORS', GUARD_ERRORS)}:", None)
            self.line(f"        {failed}()", None)
        dispatch = getattr(self.unit, "dispatch", None)
        if dispatch is not None and self.unit.self_name is not None:
            chosen = self.const(dispatch.chosen, "implementation")
            refuse = self.const(functools.partial(stale_dispatch, dispatch, self.unit.label), "stale_dispatch")
            me = self.var(self.unit.self_name)
            self.line(f"    if {self.const(dispatch.resolve, 'dispatch')}({me}) is not {chosen}: {refuse}({me})", None)
