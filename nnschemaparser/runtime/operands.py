"""Operands compiled once: a getter per operand and a builder of each call's arguments.

`operand_spec` classifies an operand as a constant, a frame variable or a computed value (slices,
displays); `getter` turns that into `getter(frame)`; `args_builder` precomputes a call's positional
and keyword layout so that the common case (all plain variables) is a list of names. `fusable_method_call`
tells the plain compiler when `$t = getattr(obj, 'm')` + `$t(...)` can run as one closure;
`names_read` lists the frame variables an instruction reads itself (not its nested bodies).

Depends on the schema only.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Callable, Optional
from ..schema.model import Const, Instruction, OpInstruction, SliceOf, VarRef

__all__ = ['operand_spec', 'getter', 'args_builder', 'fusable_method_call', 'mentions', 'names_read']


def operand_spec(op: Any) -> tuple[str, Any]:
    """('const', value) | ('var', name) | ('fn', getter(frame))."""
    if isinstance(op, VarRef):
        return "var", op.name
    if isinstance(op, Const):
        return "const", op.value
    if isinstance(op, SliceOf):
        parts = [operand_spec(p) for p in (op.lower, op.upper, op.step)]
        if all(k == "const" for k, _ in parts):
            return "const", slice(*(v for _, v in parts))
        getters = [getter(k, v) for k, v in parts]
        lo, hi, st = getters
        return "fn", lambda f: slice(lo(f), hi(f), st(f))
    if isinstance(op, tuple):
        parts = [operand_spec(p) for p in op]
        if all(k == "const" for k, _ in parts):
            return "const", tuple(v for _, v in parts)
        if all(k == "var" for k, _ in parts) and len(parts) > 1:
            get = itemgetter(*(v for _, v in parts))
            return "fn", get
        getters = [getter(k, v) for k, v in parts]
        return "fn", lambda f: tuple([g(f) for g in getters])
    if isinstance(op, list):
        getters = [getter(*operand_spec(p)) for p in op]
        return "fn", lambda f: [g(f) for g in getters]
    if isinstance(op, dict):
        items = [(getter(*operand_spec(k)), getter(*operand_spec(v))) for k, v in op.items()]
        return "fn", lambda f: {k(f): v(f) for k, v in items}
    return "const", op


def getter(kind: str, value: Any) -> Callable[[dict], Any]:
    if kind == "const":
        return lambda f: value
    if kind == "var":
        return itemgetter(value)
    return value


def args_builder(args: list, kwargs: dict, star_args: tuple, args_var: Optional[str],
                  kwargs_var: Optional[str]) -> tuple[Optional[tuple], Callable[[dict], tuple[list, dict]]]:
    """Returns (simple_var_names or None, build(frame) -> (args, kwargs))."""
    compiled = [operand_spec(a) for a in args]
    kw_compiled = {k: operand_spec(v) for k, v in kwargs.items()}
    simple = (not kwargs and not star_args and args_var is None and kwargs_var is None
              and all(k == "var" for k, _ in compiled))
    template = [v if k == "const" else None for k, v in compiled]
    var_slots = [(i, v) for i, (k, v) in enumerate(compiled) if k == "var"]
    fn_slots = [(i, v) for i, (k, v) in enumerate(compiled) if k == "fn"]
    kw_template = {k: v for k, (kind, v) in kw_compiled.items() if kind == "const"}
    kw_vars = [(k, v) for k, (kind, v) in kw_compiled.items() if kind == "var"]
    kw_fns = [(k, v) for k, (kind, v) in kw_compiled.items() if kind == "fn"]
    stars = frozenset(star_args)

    def build(f: dict) -> tuple[list, dict]:
        a = template.copy()
        for i, name in var_slots:
            a[i] = f[name]
        for i, g in fn_slots:
            a[i] = g(f)
        if stars:
            flat = []
            for i, item in enumerate(a):
                if i in stars:
                    flat.extend(item)
                else:
                    flat.append(item)
            a = flat
        if args_var is not None:
            a.extend(f[args_var])
        kw = kw_template.copy() if kw_template else {}
        for k, name in kw_vars:
            kw[k] = f[name]
        for k, g in kw_fns:
            kw[k] = g(f)
        if kwargs_var is not None:
            extra = f[kwargs_var]
            for k in extra:
                if k in kw:
                    raise TypeError(f"got multiple values for keyword argument '{k}'")
            kw.update(extra)
        return a, kw

    return (tuple(v for _, v in compiled) if simple else None), build




def fusable_method_call(first: Instruction, second: Instruction) -> bool:
    return (type(first) is OpInstruction and first.target is getattr and len(first.args) == 2
            and isinstance(first.args[1], str) and not first.kwargs and not first.star_args
            and first.out_var.startswith("$") and type(second) is OpInstruction
            and isinstance(second.target, VarRef) and second.target.name == first.out_var
            and not mentions(second, first.out_var))


def mentions(instr: OpInstruction, name: str) -> bool:
    def walk(op: Any) -> bool:
        if isinstance(op, VarRef):
            return op.name == name
        if isinstance(op, (list, tuple)):
            return any(walk(o) for o in op)
        if isinstance(op, dict):
            return any(walk(k) or walk(v) for k, v in op.items())
        if isinstance(op, SliceOf):
            return walk(op.lower) or walk(op.upper) or walk(op.step)
        return False

    return walk(instr.args) or walk(instr.kwargs) or name in (instr.args_var, instr.kwargs_var)


_READ_FIELDS = ("target", "args", "kwargs", "defaults", "kw_defaults", "exc", "cause")
_READ_NAMES = ("args_var", "kwargs_var", "callee_var", "context_var", "cond_var")


def names_read(instr: Instruction) -> list[str]:
    """The frame variables `instr` itself reads (operands, `*args`/`**kwargs` names, returned names);
    the instructions of nested bodies and conditions are not included: they are compiled on their own."""
    found: list[str] = []

    def walk(op: Any) -> None:
        if isinstance(op, VarRef):
            found.append(op.name)
        elif isinstance(op, (list, tuple)):
            for o in op:
                walk(o)
        elif isinstance(op, dict):
            for k, v in op.items():
                walk(k)
                walk(v)
        elif isinstance(op, SliceOf):
            walk(op.lower)
            walk(op.upper)
            walk(op.step)

    for name in _READ_FIELDS:
        walk(getattr(instr, name, None))
    for name in _READ_NAMES:
        value = getattr(instr, name, None)
        if isinstance(value, str) and value:
            found.append(value)
    found.extend(getattr(instr, "out_vars", ()) or ())
    return found
