"""Compilation of calls: ops, fused method calls, sub-block calls (static, dynamic, live) and defs.

A mixin of `Program` (see program.py): each `compile_<Instruction>` returns the closure that runs
the instruction on a frame dict. Ops call their real torch callable with arguments laid out once
(fast paths for 0-3 plain variables); a `BlockInstruction` runs its child's block through the
program's cached invoker (module hooks included), calls a module value through `call_value`, or
calls the live child when it is not in the schema; a `FunctionInstruction` makes an
`InterpretedFunction` closing over the frame.

Depends on the schema, `argument_binding`, `operands` and `functions`.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Callable

from .argument_binding import nested_qualname
from .functions import InterpretedFunction, Unit
from .operands import args_builder, getter, operand_spec
from ..schema.model import BlockInstruction, FunctionInstruction, OpInstruction, VarRef

__all__ = ['CallCompiler']


class CallCompiler:
    """Compiles the instructions that call something: ops, fused method calls, sub-block calls, defs."""

    def compile_method_call(self, fetch: OpInstruction, call: OpInstruction, unit: Unit) -> Callable:
        kind, receiver = operand_spec(fetch.args[0])
        get_receiver = getter(kind, receiver)
        attr = fetch.args[1]
        out = call.out_var
        simple, build = args_builder(call.args, call.kwargs, call.star_args, call.args_var, call.kwargs_var)
        call_value = self.call_value
        empty: dict = {}
        if simple is not None and kind == "var":
            names = simple

            def run_method_simple(f: dict, _i=call, _r=fetch) -> None:
                f[out] = call_value(getattr(f[receiver], attr), [f[n] for n in names], empty)

            return run_method_simple

        def run_method(f: dict, _i=call, _r=fetch) -> None:  # _r: the fused getattr, for error reports
            method = getattr(get_receiver(f), attr)
            a, kw = build(f)
            f[out] = call_value(method, a, kw)

        return run_method

    def compile_OpInstruction(self, instr: OpInstruction, unit: Unit) -> Callable:
        out = instr.out_var
        simple, build = args_builder(instr.args, instr.kwargs, instr.star_args, instr.args_var, instr.kwargs_var)
        target = instr.target
        if isinstance(target, VarRef):
            tname = target.name
            call_value = self.call_value

            def run_dynamic(f: dict, _i=instr) -> None:
                a, kw = build(f)
                f[out] = call_value(f[tname], a, kw)

            return run_dynamic
        t = target
        if simple is not None:
            n = len(simple)
            if n == 1:
                (a0,) = simple

                def run1(f: dict, _i=instr) -> None:
                    f[out] = t(f[a0])

                return run1
            if n == 2:
                a0, a1 = simple

                def run2(f: dict, _i=instr) -> None:
                    f[out] = t(f[a0], f[a1])

                return run2
            if n == 3:
                a0, a1, a2 = simple

                def run3(f: dict, _i=instr) -> None:
                    f[out] = t(f[a0], f[a1], f[a2])

                return run3
            if n == 0:
                def run0(f: dict, _i=instr) -> None:
                    f[out] = t()

                return run0
            get = itemgetter(*simple)

            def run_n(f: dict, _i=instr) -> None:
                f[out] = t(*get(f))

            return run_n

        def run(f: dict, _i=instr) -> None:
            a, kw = build(f)
            f[out] = t(*a, **kw)

        return run

    def compile_BlockInstruction(self, instr: BlockInstruction, unit: Unit) -> Callable:
        out = instr.out_var
        _, build = args_builder(instr.args, instr.kwargs, instr.star_args, instr.args_var, instr.kwargs_var)
        ref = instr.block_ref
        call_block = self.call_block
        if instr.callee_var is not None:
            callee = instr.callee_var
            call_value = self.call_value
            method = ref.method
            simple, _ = args_builder(instr.args, instr.kwargs, instr.star_args, instr.args_var, instr.kwargs_var)
            if simple is not None and method is None:
                names = simple
                empty: dict = {}

                def run_dynamic_block_simple(f: dict, _i=instr) -> None:
                    f[out] = call_value(f[callee], [f[n] for n in names], empty)

                return run_dynamic_block_simple

            def run_dynamic_block(f: dict, _i=instr) -> None:
                a, kw = build(f)
                target = f[callee]
                if method is not None:
                    target = getattr(target, method)
                f[out] = call_value(target, a, kw)

            return run_dynamic_block
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

        invoker = self.invoker
        expected = block.module
        parts = tuple(path.split(".")) if path else ()
        if not parts or expected is None or module is None:
            def run_block(f: dict, _i=instr) -> None:
                a, kw = build(f)
                f[out] = invoker(block)(a, kw)

            return run_block
        # The child is read from the module at each call, as `self.child(x)` does: forward may
        # replace it (`self.child = nn.Linear(...)`), and the new one runs (its block, if it has one).
        call_value = self.call_value
        first, rest = parts[0], parts[1:]
        children = module._modules

        def run_child(f: dict, _i=instr) -> None:
            a, kw = build(f)
            live = children.get(first)
            for part in rest:
                live = live._modules.get(part) if live is not None else None
            if live is expected:
                f[out] = invoker(block)(a, kw)
            else:
                f[out] = call_value(live_target(), a, kw)

        return run_child

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
