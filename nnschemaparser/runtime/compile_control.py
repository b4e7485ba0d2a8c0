"""Compilation of control flow: if/while/for, try, with, raise, del, return, break and continue.

A mixin of `Program` (see program.py). Control flow travels as the closures' return values (the
signals of `observer`): a loop consumes BREAK/CONTINUE, RETURN passes up to the unit's run loop.
`try` turns a frame-dict miss into CPython's UnboundLocalError/NameError before its handlers see it,
and never catches `StepAbandoned`. `compile_lazy` prepares a generator expression's helper for the
lazy walk in `functions`.

Depends on the schema, `operands`, `functions` and `observer`.
"""

from __future__ import annotations

import sys
from operator import itemgetter
from typing import Any, Callable

from .functions import LAZY_FOR, LAZY_IF, LAZY_RUN, LAZY_YIELD, Unit, holds_element, is_element, run_list, unbound_in
from .observer import BREAK, CONTINUE, RETURN, RETURN_SLOT, StepAbandoned
from .operands import Piece, args_builder, getter, names_read, operand_spec
from ..schema.model import BreakInstruction, ContinueInstruction, ControlInstruction, DeleteInstruction, Instruction, RaiseInstruction, ReturnInstruction, TryInstruction, WithInstruction, condition_instructions

__all__ = ['ControlCompiler']


class ControlCompiler:
    """Compiles control flow and the statements that end or leave a block."""

    def compile_lazy(self, instrs: list[Instruction], unit: Unit) -> list[tuple]:
        """The steps `_walk_lazy` runs: loops and ifs around the element are walked, the rest compiled."""
        steps: list[tuple] = []
        for instr in instrs:
            if is_element(instr):
                _, build = args_builder(instr.args, instr.kwargs, instr.star_args, instr.args_var, instr.kwargs_var)
                read = unit.weight_reader(names_read(instr)) if unit.weights else None
                if read is not None:
                    build = (lambda f, _b=build, _r=read: (_r(f), _b(f))[1])
                steps.append((LAZY_YIELD, build))
            elif holds_element(instr) and instr.kind == "for":
                steps.append((LAZY_FOR, self.lazy_condition(instr, unit), instr.cond_var, instr.bind_var,
                              self.compile_lazy(instr.body, unit)))
            elif holds_element(instr):
                steps.append((LAZY_IF, self.lazy_condition(instr, unit), instr.cond_var,
                              self.compile_lazy(instr.body, unit), self.compile_lazy(instr.else_body, unit)))
            else:
                steps.append((LAZY_RUN, self.compile(instr, unit)))
        return steps

    def lazy_condition(self, instr: ControlInstruction, unit: Unit) -> list[Callable]:
        condition = self.compile_list(condition_instructions(instr), unit)
        read = unit.weight_reader([instr.cond_var]) if unit.weights else None
        condition = [*condition, read] if read is not None else condition
        return self.unstepped(condition) if instr.kind == "if" else condition

    def unstepped(self, condition: list[Callable]) -> list[Callable]:
        """An `if` test (or a `while` re-evaluation), told to the observer as a condition: it is not
        a step of `step_run` (spec 000), while traces still record its instructions."""
        observer = self.observer
        if observer is None or not condition:
            return condition
        begin, end = observer.begin_condition, observer.end_condition

        def run_condition(f: dict) -> None:
            begin()
            try:
                for fn in condition:
                    fn(f)
            finally:
                end()

        return [run_condition]

    def compile_ControlInstruction(self, instr: ControlInstruction, unit: Unit) -> Callable:
        condition = self.compile_list(condition_instructions(instr), unit)
        read = unit.weight_reader([instr.cond_var]) if unit.weights else None
        if read is not None:  # `while self.flag:` reads the live buffer at each test
            condition = [*condition, read]
        body = self.compile_list(instr.body, unit)
        else_body = self.compile_list(instr.else_body, unit)
        cond_var = instr.cond_var
        if instr.kind == "if":
            condition = self.unstepped(condition)
            def run_if(f: dict, _i=instr) -> Any:
                for fn in condition:
                    fn(f)
                if f[cond_var]:
                    return run_list(body, f) if body else None
                return run_list(else_body, f) if else_body else None

            return run_if
        if instr.kind == "while":
            again = self.unstepped(condition)  # the first test is a step, its re-evaluations are not

            def run_while(f: dict, _i=instr) -> Any:
                test = condition
                while True:
                    for fn in test:
                        fn(f)
                    test = again
                    if not f[cond_var]:
                        break
                    signal = run_list(body, f)
                    if signal is not None:
                        if signal is BREAK:
                            return None
                        if signal is CONTINUE:
                            continue
                        return signal
                return run_list(else_body, f) if else_body else None

            return run_while
        bind_var = instr.bind_var
        index_var = instr.index_var

        def run_for(f: dict, _i=instr) -> Any:
            for fn in condition:
                fn(f)
            iterable = f[cond_var]
            position = 0
            for item in iterable:
                f[bind_var] = item
                if index_var is not None:
                    f[index_var] = position
                    position += 1
                signal = run_list(body, f)
                if signal is not None:
                    if signal is BREAK:
                        return None
                    if signal is CONTINUE:
                        continue
                    return signal
            return run_list(else_body, f) if else_body else None

        return run_for

    def compile_TryInstruction(self, instr: TryInstruction, unit: Unit) -> Callable:
        body = self.compile_list(instr.body, unit)
        handlers = [(classes, name, self.compile_list(hbody, unit))
                    for classes, name, hbody in zip(instr.handlers, instr.handler_names, instr.handler_bodies)]
        else_body = self.compile_list(instr.else_body, unit)
        final_body = self.compile_list(instr.final_body, unit)

        def run_try(f: dict, _i=instr) -> Any:
            try:
                try:
                    try:
                        signal = run_list(body, f)
                    except KeyError as missed:  # an unbound read is a NameError for the handlers too
                        unbound = unbound_in(missed, unit)
                        if unbound is None:
                            raise
                        raise unbound from None
                except StepAbandoned:
                    raise
                except BaseException as exc:
                    for classes, name, hbody in handlers:
                        if not classes or isinstance(exc, classes):
                            if name is not None:
                                f[name] = exc
                            try:
                                return run_list(hbody, f)
                            finally:
                                if name is not None:
                                    f.pop(name, None)
                    raise
                if signal is not None:
                    return signal
                return run_list(else_body, f) if else_body else None
            except KeyError as missed:  # from a handler or the else body: before `finally` rebinds the name
                unbound = unbound_in(missed, unit)
                if unbound is None:
                    raise
                raise unbound from None
            finally:
                if final_body:
                    final_signal = run_list(final_body, f)
                    if final_signal is not None:
                        return final_signal  # noqa: B012 - a return in finally overrides, as in Python

        return run_try

    def compile_WithInstruction(self, instr: WithInstruction, unit: Unit) -> Callable:
        body = self.compile_list(instr.body, unit)
        context_var = instr.context_var
        bind_var = instr.bind_var

        def run_with(f: dict, _i=instr) -> Any:
            with f[context_var] as value:
                if bind_var is not None:
                    f[bind_var] = value
                return run_list(body, f)

        return run_with

    def compile_RaiseInstruction(self, instr: RaiseInstruction, unit: Unit) -> Callable:
        exc_get = getter(*operand_spec(instr.exc)) if instr.exc is not None else None
        cause_get = getter(*operand_spec(instr.cause)) if instr.has_cause else None

        def run_raise(f: dict, _i=instr) -> None:
            if exc_get is None:
                active = sys.exc_info()[1]
                if active is None:
                    raise RuntimeError("No active exception to reraise")
                raise active
            exc = exc_get(f)
            if cause_get is not None:
                raise exc from cause_get(f)
            raise exc

        return run_raise

    def compile_DeleteInstruction(self, instr: DeleteInstruction, unit: Unit) -> Callable:
        names = tuple(instr.names)

        def run_delete(f: dict, _i=instr) -> None:
            for name in names:
                if name not in f:
                    raise UnboundLocalError(f"cannot access local variable '{name}' where it is not associated "
                                            "with a value")
                del f[name]

        return run_delete

    def compile_ReturnInstruction(self, instr: ReturnInstruction, unit: Unit) -> Callable:
        names = tuple(instr.out_vars)
        if not names:
            def run_return_none(f: dict, _i=instr) -> str:
                f[RETURN_SLOT] = None
                return RETURN

            return run_return_none
        if len(names) == 1 and not instr.as_tuple:
            (name,) = names

            def run_return(f: dict, _i=instr) -> str:
                f[RETURN_SLOT] = f[name]
                return RETURN

            return run_return
        get = itemgetter(*names)
        single = len(names) == 1

        def run_return_tuple(f: dict, _i=instr) -> str:
            value = get(f)
            f[RETURN_SLOT] = (value,) if single else value
            return RETURN

        return run_return_tuple

    @staticmethod
    def return_piece(instr: ReturnInstruction) -> Piece:
        """What `compile_ReturnInstruction`'s closure does before it signals RETURN, as a piece."""
        names = tuple(instr.out_vars)
        env: dict = {"_i": instr, "slot": RETURN_SLOT}
        reads = []
        for j, name in enumerate(names):
            env[f"n{j}"] = name
            reads.append(f"f[n{j}]")
        if not names:
            value = "None"
        elif len(names) == 1 and not instr.as_tuple:
            value = reads[0]
        else:
            value = "(" + ", ".join(reads) + ("," if len(names) == 1 else "") + ")"
        return Piece(f"f[slot] = {value}", env)

    def compile_BreakInstruction(self, instr: BreakInstruction, unit: Unit) -> Callable:
        return lambda f, _i=instr: BREAK

    def compile_ContinueInstruction(self, instr: ContinueInstruction, unit: Unit) -> Callable:
        return lambda f, _i=instr: CONTINUE
