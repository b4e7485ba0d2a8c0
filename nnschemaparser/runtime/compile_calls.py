"""Compilation of calls: ops, fused method calls, sub-block calls (static, dynamic, live) and defs.

A mixin of `Program` (see program.py): each `compile_<Instruction>` returns the closure that runs
the instruction on a frame dict, or the `operands.Piece` of source that `bodies.fuse_body` splices
into a generated body (ops call their real torch callable, operators are written as operators); a `BlockInstruction` runs its child's block through the
program's cached invoker (module hooks included), calls a module value through `call_value`, or
calls the live child when it is not in the schema; a `FunctionInstruction` makes an
`InterpretedFunction` closing over the frame.

Depends on the schema, `argument_binding`, `operands` and `functions`.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Callable, Optional

from torch import nn

from .argument_binding import nested_qualname
from .functions import InterpretedFunction, Unit
from .operands import Piece, args_builder, attribute_name, call_piece, getter, operand_spec, operand_text, operator_piece
from ..schema.model import BlockInstruction, FunctionInstruction, OpInstruction, VarRef

__all__ = ['CallCompiler']

_Module = nn.Module


def eager_callee(module: Any, method: Optional[str]) -> Any:
    """What eager calls for a sub-block call (the module, its method, or `super()`'s `Class.method`),
    read only to word a keyword error as CPython would."""
    if method is None or module is None:
        return module
    if "." in method:
        owner, name = method.rsplit(".", 1)
        for cls in type(module).__mro__:
            if cls.__name__ == owner and name in vars(cls):
                return getattr(cls, name).__get__(module)
        return module
    return getattr(module, method)


class CallCompiler:
    """Compiles the instructions that call something: ops, fused method calls, sub-block calls, defs."""

    def compile_method_call(self, fetch: OpInstruction, call: OpInstruction, unit: Unit,
                            bind_method: bool = False) -> Piece:
        """`$t = getattr(obj, 'm')` + `out = $t(...)` as one piece (`bind_method`: `$t` is bound too)."""
        env = {"_i": call, "_r": fetch, "out": call.out_var, "attr": fetch.args[1], "call_value": self.call_value,
               "Module": _Module, "tv": fetch.out_var}
        receiver = operand_text(fetch.args[0], "rv", env)
        bind = "f[tv] = " if bind_method else ""
        if not bind_method:
            del env["tv"]
        name = attribute_name(fetch.args[1])
        if name is not None:  # `x.view`, as the source wrote it
            del env["attr"]
            return call_piece(f"m = {bind}{receiver}.{name}\n"
                              "f[out] = call_value(m, {lists}) if isinstance(m, Module) else m({call})",
                              env, call.args, call.kwargs, call.star_args, call.args_var, call.kwargs_var, "m")
        # A module's method (its forward, say) goes through call_value, which runs its block; any
        # other callable is called directly, as call_value would.
        return call_piece(f"m = {bind}getattr({receiver}, attr)\n"
                            "f[out] = call_value(m, {lists}) if isinstance(m, Module) else m({call})",
                            env, call.args, call.kwargs, call.star_args, call.args_var, call.kwargs_var, "m")

    def compile_OpInstruction(self, instr: OpInstruction, unit: Unit) -> Piece:
        out = instr.out_var
        target = instr.target
        if isinstance(target, VarRef):
            env = {"_i": instr, "out": out, "tname": target.name, "call_value": self.call_value, "Module": _Module}
            return call_piece("m = f[tname]\n"
                              "f[out] = call_value(m, {lists}) if isinstance(m, Module) else m({call})",
                              env, instr.args, instr.kwargs, instr.star_args, instr.args_var, instr.kwargs_var, "m")
        if not instr.kwargs and not instr.star_args and instr.args_var is None and instr.kwargs_var is None:
            inline = operator_piece(out, target, instr.args, {"_i": instr})
            if inline is not None:
                return inline
        return call_piece("f[out] = t({call})", {"_i": instr, "out": out, "t": target}, instr.args, instr.kwargs,
                          instr.star_args, instr.args_var, instr.kwargs_var, "t")

    def compile_BlockInstruction(self, instr: BlockInstruction, unit: Unit) -> Any:
        out = instr.out_var
        _, build = args_builder(instr.args, instr.kwargs, instr.star_args, instr.args_var, instr.kwargs_var)
        ref = instr.block_ref
        if instr.callee_var is not None:
            callee = instr.callee_var
            call_value = self.call_value
            method = ref.method
            env = {"_i": instr, "out": out, "callee": callee, "method": method, "call_value": call_value}
            fetch = "f[callee]" if method is None else "getattr(f[callee], method)"
            return call_piece(f"f[out] = call_value({fetch}, {{lists}})", env, instr.args, instr.kwargs,
                              instr.star_args, instr.args_var, instr.kwargs_var, fetch)
        owner = unit.block
        try:
            block = owner.find(ref.path)
        except KeyError:
            block = None
        if block is not None and ref.method is not None:
            block = block.methods.get(ref.method)
        path, method = ref.path, ref.method
        module = owner.module

        def live_target() -> Any:
            target = module
            for part in path.split(".") if path else ():
                target = target[int(part)] if part.lstrip("-").isdigit() else getattr(target, part)
            if method is not None:
                target = getattr(target, method)
            return target

        if block is None:
            # The child is not in the schema (None at parse time, or replaced since): call it live.
            def run_live(f: dict, _i=instr) -> None:
                a, kw = build(f)
                f[out] = live_target()(*a, **kw)

            return run_live

        # The child's invoker is looked up at its first call (compiling it now would compile the
        # whole tree, and a block that calls itself forever), then called straight from the cell.
        invoker = self.invoker
        cell: list = []

        def first_call(args: list, kwargs: dict) -> Any:
            invoke = invoker(block)
            cell[0] = invoke
            return invoke(args, kwargs)

        cell.append(first_call)
        expected, child_method = block.module, ref.method
        env = {"_i": instr, "out": out, "cell": cell, "callee": lambda: eager_callee(expected, child_method)}
        parts = tuple(path.split(".")) if path else ()
        if not parts or expected is None or module is None:
            return call_piece("f[out] = cell[0]({lists})", env, instr.args, instr.kwargs,
                              instr.star_args, instr.args_var, instr.kwargs_var, "callee()")
        # The child is read from the module at each call, as `self.child(x)` does: forward may
        # replace it (`self.child = nn.Linear(...)`), and the new one runs (its block, if it has one).
        first, rest = parts[0], parts[1:]
        children = module._modules

        def current() -> Any:
            live = children.get(first)
            for part in rest:
                live = live._modules.get(part) if live is not None else None
            return live

        env.update(expected=expected, current=current, children=children, first=first,
                   call_value=self.call_value, live_target=live_target)
        test = "children.get(first) is expected" if not rest else "current() is expected"
        return call_piece(f"f[out] = cell[0]({{lists}}) if {test} else call_value(live_target(), {{lists}})",
                          env, instr.args, instr.kwargs, instr.star_args, instr.args_var, instr.kwargs_var, "callee()")

    def compile_FunctionInstruction(self, instr: FunctionInstruction, unit: Unit) -> Callable:
        schema = instr.function
        qualname = nested_qualname(unit.qualname, unit.schema.name, unit.is_block, schema.name)
        inner = Unit(self, unit.block, schema, is_block=False, qualname=qualname)
        out = instr.out_var
        positional = schema.params
        default_ops = [(getter(*operand_spec(d))) for d in instr.defaults]
        default_names = positional[len(positional) - len(default_ops):] if default_ops else []
        kw_defaults = {k: getter(*operand_spec(v)) for k, v in instr.kw_defaults.items()}
        program = self

        def run_function(f: dict, _i=instr) -> None:
            defaults = {name: g(f) for name, g in zip(default_names, default_ops)}
            for k, g in kw_defaults.items():
                defaults[k] = g(f)
            f[out] = InterpretedFunction(program, schema, inner, f, defaults)

        return run_function
