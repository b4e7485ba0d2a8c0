"""What the code generator reads off instructions before it writes anything.

`names_read` (in `functions`) lists the variables an instruction reads; here: which pairs of
instructions run as one method call (`fusable_method_call`), every instruction of a body
(`walk_instructions`), the names a function binds, whether a plain run can keep its variables as
fast locals (`uses_frame`), literals that can be written into the source as they are
(`literal`), safe identifiers (`identifier`), an instruction's source position (`position`), and
`operand_reader`, which evaluates an operand over a frame dict for views of a paused call.

Depends on the schema and `functions`.
"""

from __future__ import annotations

import math
import operator
import sys
import types
from typing import Any, Callable, Optional

from ..schema.model import (Const, ControlInstruction, FunctionInstruction, FunctionSchema, Instruction,
                            OpInstruction, SliceOf, TryInstruction, VarRef, WithInstruction, condition_instructions)
from .functions import names_read

__all__ = ["fusable_method_call", "walk_instructions", "bound_names", "uses_frame", "operand_reader", "read_binding", "identifier",
           "literal", "quote", "is_element", "position", "never_tensor", "NOT_TENSOR_TYPES", "MAX_BLOCKS",
           "MAX_INDENT"]

# Python limits how deeply statements nest (20 blocks, 100 indentation levels); a compound
# statement deeper than these runs as a part of its own (frame mode only), called with the frame.
MAX_BLOCKS = 12
MAX_INDENT = 60


def fusable_method_call(first: Instruction, second: Instruction) -> bool:
    """`$t = getattr(obj, 'm')` followed by `out = $t(...)` that reads `$t` only as its callee."""
    return (type(first) is OpInstruction and first.target is getattr and len(first.args) == 2
            and isinstance(first.args[1], str) and not first.kwargs and not first.star_args
            and first.args_var is None and first.kwargs_var is None
            and first.out_var.startswith("$") and type(second) is OpInstruction
            and isinstance(second.target, VarRef) and second.target.name == first.out_var
            and names_read(second).count(first.out_var) == 1)  # read as the callee only


# Types none of whose instances `isinstance(value, torch.Tensor)` accepts (none is a Tensor subclass
# and none lets an instance report another `__class__`): generated code that asks whether a value is
# a tensor tests `type(value) in NOT_TENSOR_TYPES` before the slower isinstance call.
NOT_TENSOR_TYPES = frozenset({int, float, bool, complex, str, bytes, type(None), type(Ellipsis), tuple, list, dict,
                              set, frozenset, slice, range, types.MethodType, types.BuiltinMethodType,
                              types.FunctionType, types.MethodWrapperType, type})

# Instructions whose result is never a tensor, whatever their operands: a container built by the
# lowering's intrinsics, a comparison by identity, a negation, a truth test, an f-string.
_NEVER_TENSOR_OPERATORS = (operator.not_, operator.is_, operator.is_not, operator.truth, operator.contains)
_NEVER_TENSOR_INTRINSICS = ("build_tuple", "build_list", "build_set", "build_dict", "merge_kwargs", "unpack",
                            "unpack_starred", "fstring", "contains", "not_in", "make_slice", "truth")
_INTRINSICS = "nnschemaparser.lowering.intrinsics"
_LITERAL_TYPES = (int, float, bool, complex, str, bytes, type(None))
_NUMBER_TYPES = (int, float, bool, complex)
_ARITHMETIC = (operator.neg, operator.pos, operator.invert, operator.add, operator.sub, operator.mul,
               operator.truediv, operator.floordiv, operator.mod, operator.pow)


def never_tensor(instr: Instruction) -> bool:
    """Whether `instr` binds something that can never be a tensor, known from the instruction alone:
    an op whose callee (fixed at lowering time, not read live through a binding) is one of the
    lowering's intrinsics building a container, string, slice or bool, an identity comparison or
    negation, arithmetic of number literals (`-1`), or the assignment of a literal number, string
    or None. Such an instruction needs no
    run-time test of its result where a run counts or reports tensor results."""
    if type(instr) is not OpInstruction or getattr(instr, "binding", None) is not None:
        return False
    target = instr.target
    if any(target is known for known in _NEVER_TENSOR_OPERATORS):
        return True
    if any(target is known for known in _ARITHMETIC):  # `-1`: arithmetic of number literals only
        return bool(instr.args) and not instr.kwargs and not instr.star_args and instr.args_var is None \
            and all(type(arg) in _NUMBER_TYPES for arg in instr.args)
    intrinsics = sys.modules.get(_INTRINSICS)  # the runtime never imports the lowering itself
    if intrinsics is None or isinstance(target, VarRef):
        return False
    if any(target is getattr(intrinsics, name, None) for name in _NEVER_TENSOR_INTRINSICS):
        return True
    return (target is getattr(intrinsics, "assign", None) and len(instr.args) == 1 and not instr.star_args
            and instr.args_var is None and type(instr.args[0]) in _LITERAL_TYPES)


def walk_instructions(instrs: list) -> Any:
    for instr in instrs:
        yield instr
        if isinstance(instr, ControlInstruction):
            yield from walk_instructions(condition_instructions(instr))
            yield from walk_instructions(instr.body)
            yield from walk_instructions(instr.else_body)
        elif isinstance(instr, TryInstruction):
            yield from walk_instructions(instr.body)
            for body in instr.handler_bodies:
                yield from walk_instructions(body)
            yield from walk_instructions(instr.else_body)
            yield from walk_instructions(instr.final_body)
        elif isinstance(instr, WithInstruction):
            yield from walk_instructions(instr.body)


def bound_names(instr: Instruction) -> list[str]:
    names = []
    if instr.out_var and not isinstance(instr, (ControlInstruction, TryInstruction, WithInstruction)):
        names.append(instr.out_var)
    if isinstance(instr, ControlInstruction):
        names.extend(n for n in (instr.bind_var, instr.index_var) if n)
    if isinstance(instr, WithInstruction) and instr.bind_var:
        names.append(instr.bind_var)
    if isinstance(instr, TryInstruction):
        names.extend(n for n in instr.handler_names if n)
    return names


def uses_frame(schema: FunctionSchema, weights: tuple) -> Optional[str]:
    """Why `schema` must keep its variables in a frame dict even in a plain run (None: it need not).

    A function that defines closures (they read its variables late, by name), one with free
    variables, one that reads a variable it never binds (CPython would read a global there) and
    one nested deeper than Python's limits keep the frame."""
    if schema.free_vars or schema.nonlocal_vars:
        return "it has free variables"
    bound = set(schema.params) | set(schema.kwonly) | {n for n in (schema.vararg, schema.kwarg) if n}
    bound |= {ref for ref, _ in weights}
    if schema.self_name:
        bound.add(schema.self_name)
    read: set = set()
    for instr in walk_instructions(schema.body):
        if isinstance(instr, FunctionInstruction):
            return "it defines a closure"
        bound.update(bound_names(instr))
        read.update(names_read(instr))
    if read - bound:
        return "it reads a variable it never binds"
    if _too_deep(schema.body, 0, 0):
        return "it nests deeper than Python allows"
    return None


def _too_deep(instrs: list, blocks: int, indent: int) -> bool:
    for instr in instrs:
        if isinstance(instr, ControlInstruction):
            extra = 0 if instr.kind == "if" else 1
            if blocks + extra >= MAX_BLOCKS or indent + 2 >= MAX_INDENT:
                return True
            if _too_deep(instr.body, blocks + extra, indent + 2) or _too_deep(instr.else_body, blocks + extra,
                                                                                  indent + 2):
                return True
        elif isinstance(instr, TryInstruction):
            if blocks + 3 >= MAX_BLOCKS or indent + 4 >= MAX_INDENT:
                return True
            for body in (instr.body, *instr.handler_bodies, instr.else_body, instr.final_body):
                if _too_deep(body, blocks + 3, indent + 4):
                    return True
        elif isinstance(instr, WithInstruction):
            if blocks + 1 >= MAX_BLOCKS or indent + 1 >= MAX_INDENT:
                return True
            if _too_deep(instr.body, blocks + 1, indent + 1):
                return True
    return False


def read_binding(binding: Any) -> Any:
    """What the name a Binding stands for gives now (a global, a closure cell, then its attributes)."""
    value = binding.namespace.cell_contents if binding.kind == "closure" else binding.namespace[binding.key]
    for attr in binding.attrs:
        value = getattr(value, attr)
    return value


def operand_reader(op: Any) -> Callable[[dict], Any]:
    """`read(frame)` evaluating operand `op` over a frame dict (for views of a paused call)."""
    if isinstance(op, VarRef):
        name = op.name
        return lambda f: f[name]
    if isinstance(op, Const):
        if op.binding is not None:
            binding = op.binding
            return lambda f: read_binding(binding)
        value = op.value
        return lambda f: value
    if isinstance(op, SliceOf):
        parts = [operand_reader(p) for p in (op.lower, op.upper, op.step)]
        return lambda f: slice(*(p(f) for p in parts))
    if isinstance(op, tuple):
        parts = [operand_reader(p) for p in op]
        return lambda f: tuple([p(f) for p in parts])
    if isinstance(op, list):
        parts = [operand_reader(p) for p in op]
        return lambda f: [p(f) for p in parts]
    if isinstance(op, dict):
        items = [(operand_reader(k), operand_reader(v)) for k, v in op.items()]
        return lambda f: {k(f): v(f) for k, v in items}
    return lambda f: op


def identifier(text: str) -> str:
    out = "".join(ch if (ch.isalnum() or ch == "_") and ch.isascii() else "_" for ch in text)
    out = out.strip("_") or "v"
    if out[0].isdigit():
        out = "_" + out
    return out


def quote(text: Any) -> str:
    """`text` as a string literal of generated source: only a plain `str` (a subclass could make its
    repr anything), written by `str.__repr__`, so no file can put code into the generated text."""
    if type(text) is not str:
        raise TypeError(f"names in a schema must be strings, not {type(text).__name__}")
    return str.__repr__(text)


def literal(value: Any) -> Optional[str]:
    """Source text that evaluates to exactly `value` (a fresh equal object for immutables), or None."""
    kind = type(value)
    if value is Ellipsis:
        return "..."
    if value is None or kind is bool:
        return repr(value)
    if kind is int:
        return repr(value) if abs(value) < 1 << 64 else None
    if kind is float:
        return repr(value) if math.isfinite(value) else None
    if kind is str:
        return str.__repr__(value) if len(value) <= 200 else None
    if kind is tuple and len(value) <= 16:
        parts = [literal(v) for v in value]
        if all(p is not None for p in parts):
            return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    return None


def is_element(instr: Instruction) -> bool:
    """The `$result.append(element)` the lowering emits at the heart of a comprehension helper."""
    return (isinstance(instr, OpInstruction) and instr.target is list.append and len(instr.args) == 2
            and instr.args[0] == VarRef("$result"))


def position(instr: Optional[Instruction], firstline: int) -> tuple:
    loc = getattr(instr, "location", None)
    if loc is None or not isinstance(loc.lineno, int) or loc.lineno < 1:
        return (firstline, firstline, 0, 0)
    end = loc.end_lineno if isinstance(loc.end_lineno, int) and loc.end_lineno >= loc.lineno else loc.lineno
    col = loc.col if isinstance(loc.col, int) and loc.col >= 0 else 0
    end_col = loc.end_col if isinstance(loc.end_col, int) and loc.end_col >= 0 else 0
    if end == loc.lineno and end_col < col:
        end_col = col
    return (loc.lineno, end, col, end_col)

