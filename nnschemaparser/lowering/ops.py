"""The OpInstructions every part of the lowering builds.

`op_instruction` makes one OpInstruction; `named_test` and `split_condition` give a lowered test its
(prepare, condition) form (schema.model.ControlInstruction); `qualified_name_of` names a callable
with an importable dotted name. Shared by expressions, calls, comprehensions, container_loops and
statements, so none of them imports another for these. Depends on schema and intrinsics.
"""

from __future__ import annotations

import types
from typing import Any, Optional

from . import intrinsics
from ..schema.notation import operand_text
from ..schema.model import Instruction, OpInstruction, TEST_STYLE, VarRef

__all__ = ["op_instruction", "qualified_name_of", "named_test", "split_condition"]


def qualified_name_of(fn: Any) -> str:
    """An importable dotted name for a callable, best effort ("torch.nn.functional.linear")."""
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if name is None:
        return type(fn).__qualname__
    if module is None:
        self_obj = getattr(fn, "__self__", None)
        if isinstance(self_obj, types.ModuleType):
            module = self_obj.__name__
        elif self_obj is not None and getattr(self_obj, "__name__", None):
            module = getattr(self_obj, "__module__", None) or self_obj.__name__
    if module in ("torch._C._VariableFunctions", "torch._C._nn", "torch._C._fft", "torch._C._linalg"):
        module = {"torch._C._VariableFunctions": "torch", "torch._C._nn": "torch._C._nn"}.get(module, module)
    return f"{module}.{name}" if module else name


def op_instruction(out_var: str, target: Any, args: list, kwargs: Optional[dict] = None, *, style: str = "call",
                   display: str = "", qualified: str = "", star_args: tuple = (), args_var: Optional[str] = None,
                   kwargs_var: Optional[str] = None, mutates: bool = False) -> OpInstruction:
    if not qualified:
        qualified = operand_text(target) if isinstance(target, VarRef) else qualified_name_of(target)
    return OpInstruction(out_var=out_var, target=target, qualified_name=qualified,
                         display_name=display or qualified, args=list(args), kwargs=dict(kwargs or {}),
                         star_args=tuple(star_args), args_var=args_var, kwargs_var=kwargs_var, style=style,
                         mutates=mutates)


def named_test(cond_var: str) -> OpInstruction:
    """The condition of a test whose value is already bound to `cond_var` when it is read (a plain
    name, or a value the last instruction of `prepare` binds without being an op of its own):
    `cond_var = assign(cond_var)` of style TEST_STYLE. It names the value for viewers and tooling;
    the runtime never runs it (schema.model.condition_instructions leaves it out)."""
    return op_instruction(cond_var, intrinsics.assign, [VarRef(cond_var)], style=TEST_STYLE, display="test")


def split_condition(instrs: list[Instruction], cond_var: str) -> tuple[list[Instruction], OpInstruction]:
    """(prepare, condition) of a test lowered into `instrs`, the value bound to `cond_var`: the last
    instruction is the condition when it is an OpInstruction binding `cond_var`, else a named test
    follows all of them. `prepare + [condition]` (without a named test) is `instrs`, in order."""
    last = instrs[-1] if instrs else None
    if isinstance(last, OpInstruction) and last.out_var == cond_var:
        return instrs[:-1], last
    return list(instrs), named_test(cond_var)
