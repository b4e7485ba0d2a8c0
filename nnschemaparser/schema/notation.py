"""How operands and instructions are written as one line of text.

Shared by the lowering (to spell method callees like `hidden.relu`), the schema dump, the text trace,
error notes and the views. A pure function of schema objects: depends on schema only.
"""

from __future__ import annotations

from typing import Any

from .model import (
    BlockInstruction,
    BreakInstruction,
    Const,
    ContinueInstruction,
    ControlInstruction,
    DeleteInstruction,
    YieldInstruction,
    FunctionInstruction,
    Instruction,
    OpInstruction,
    RaiseInstruction,
    ReturnInstruction,
    SliceOf,
    TensorRepr,
    TryInstruction,
    VarRef,
    WithInstruction,
    condition_instructions,
    is_named_test,
)

__all__ = ["operand_text", "instruction_text", "value_repr", "describe_value"]


def operand_text(operand: Any) -> str:
    """`x`, `3`, `'relu'`, `torch.float32`, `[a, b]`, `1:-1`."""
    if isinstance(operand, VarRef):
        return operand.name
    if isinstance(operand, Const):
        return operand.text or repr(operand.value)
    if isinstance(operand, SliceOf):
        parts = ["" if p is None else operand_text(p) for p in (operand.lower, operand.upper)]
        text = ":".join(parts)
        if operand.step is not None:
            text += ":" + operand_text(operand.step)
        return text
    if isinstance(operand, tuple):
        inner = ", ".join(operand_text(o) for o in operand)
        return f"({inner},)" if len(operand) == 1 else f"({inner})"
    if isinstance(operand, list):
        return "[" + ", ".join(operand_text(o) for o in operand) + "]"
    if isinstance(operand, dict):
        return "{" + ", ".join(f"{operand_text(k)}: {operand_text(v)}" for k, v in operand.items()) + "}"
    if operand is Ellipsis:
        return "..."
    return repr(operand)


def _call_args(instr: Any) -> str:
    parts = []
    for index, arg in enumerate(instr.args):
        star = "*" if index in instr.star_args else ""
        parts.append(star + operand_text(arg))
    if instr.args_var:
        parts.append("*" + instr.args_var)
    parts.extend(f"{k}={operand_text(v)}" for k, v in instr.kwargs.items())
    if instr.kwargs_var:
        parts.append("**" + instr.kwargs_var)
    return ", ".join(parts)


def _index_text(index: Any) -> str:
    if isinstance(index, tuple) and index:
        return ", ".join(operand_text(i) for i in index)
    return operand_text(index)


def op_text(instr: OpInstruction) -> str:
    """The right-hand side of an OpInstruction as source-like text."""
    style = instr.style
    args = instr.args
    if style == "binary" and len(args) == 2:
        return f"{operand_text(args[0])} {instr.display_name} {operand_text(args[1])}"
    if style == "unary" and len(args) == 1:
        sep = " " if instr.display_name == "not" else ""
        return f"{instr.display_name}{sep}{operand_text(args[0])}"
    if style == "subscript" and len(args) == 2:
        return f"{operand_text(args[0])}[{_index_text(args[1])}]"
    if style == "store_subscript" and len(args) == 3:
        return f"{operand_text(args[0])}[{_index_text(args[1])}] = {operand_text(args[2])}"
    if style in ("value", "test") and len(args) == 1:
        return operand_text(args[0])
    name = instr.display_name or instr.qualified_name or "<call>"
    return f"{name}({_call_args(instr)})"


def instruction_text(instr: Instruction) -> str:
    """One line for an instruction, as the dump and the trace write it (no nested bodies)."""
    if isinstance(instr, OpInstruction):
        if is_named_test(instr):  # a ControlInstruction's condition naming a value computed before it
            return f"TEST {op_text(instr)}"
        rhs = op_text(instr)
        if instr.style == "store_subscript" or instr.display_name in ("setattr", "delattr"):
            return rhs
        return f"{instr.out_var} = {rhs}" if instr.out_var else rhs
    if isinstance(instr, BlockInstruction):
        ref = instr.block_ref
        callee = instr.callee_var or ref.path or "self"
        if ref.method:
            callee = f"{callee}.{ref.method}" if (instr.callee_var or ref.path) else f"self.{ref.method}"
        return f"{instr.out_var} = CALL {callee}({_call_args(instr)})"
    if isinstance(instr, ReturnInstruction):
        if not instr.out_vars:
            return "RETURN"
        return "RETURN " + ", ".join(instr.out_vars)
    if isinstance(instr, ControlInstruction):
        if instr.kind == "for":
            target = instr.bind_var or "_"
            source = instr.cond_var
            if instr.iter_container:  # the container itself, or a view of it (a slice, enumerate, ...)
                whole = all(isinstance(i, OpInstruction) and i.qualified_name == "builtins.getattr"
                            for i in condition_instructions(instr))
                source = f"self.{instr.iter_container}" if whole else f"{source} OVER self.{instr.iter_container}"
            return f"FOR {target} IN {source}:"
        return f"{instr.kind.upper()} {instr.cond_var}:"
    if isinstance(instr, TryInstruction):
        return "TRY:"
    if isinstance(instr, WithInstruction):
        bind = f" AS {instr.bind_var}" if instr.bind_var else ""
        return f"WITH {instr.context_var}{bind}:"
    if isinstance(instr, FunctionInstruction):
        fn = instr.function
        params = ", ".join(fn.params) if fn is not None else ""
        return f"{instr.out_var} = FUNCTION {fn.name if fn else '?'}({params})"
    if isinstance(instr, RaiseInstruction):
        if instr.exc is None:
            return "RAISE"
        cause = f" FROM {operand_text(instr.cause)}" if instr.has_cause else ""
        return f"RAISE {operand_text(instr.exc)}{cause}"
    if isinstance(instr, DeleteInstruction):
        return "DEL " + ", ".join(instr.names)
    if isinstance(instr, YieldInstruction):
        text = "YIELD" + ("" if instr.value is None else f" {operand_text(instr.value)}")
        return f"{instr.out_var} = {text}" if instr.out_var else text
    if isinstance(instr, BreakInstruction):
        return "BREAK"
    if isinstance(instr, ContinueInstruction):
        return "CONTINUE"
    return type(instr).__name__


def value_repr(value: Any) -> TensorRepr:
    """The TensorRepr of a runtime value: shape and dtype for tensors, the type name otherwise."""
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None and type(value).__module__.startswith("torch"):
        return TensorRepr(shape=tuple(int(d) for d in shape), dtype=str(dtype))
    return TensorRepr(shape=(), dtype=type(value).__name__)


def describe_value(value: Any) -> str:
    return value_repr(value).describe()
