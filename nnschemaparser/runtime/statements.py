"""The statement emitters of the code generator: every instruction kind that is not a call.

`StatementEmitters` is a part of `codegen.CodeGenerator` (its base class) kept in a module of its
own: a closure's definition, `return`, `break` / `continue`, `raise`, `yield`, `del`, and the
compound statements (`if` / `while` / `for` with their conditions, `try` with its handlers,
`with`, and statements nested past Python's limits that run as parts). Each `emit_<Instruction>`
writes its lines through the generator's own helpers (`line`, `block`, `var`, `operand`,
`helper`, `after`, `leaf`, `emit_list`), so plain and observed runs read the same here as there.

Depends on the schema, `instructions`, `functions` and `listeners` (signals, `StepAbandoned`).
"""

from __future__ import annotations

from typing import Callable, Optional

from ..schema.model import (BreakInstruction, ContinueInstruction, ControlInstruction, DeleteInstruction,
                            FunctionInstruction, Instruction, RaiseInstruction, ReturnInstruction, TryInstruction,
                            WithInstruction, YieldInstruction, condition_instructions)
from .functions import delete_names, names_read, unbound_for_handlers, write_back
from .instructions import identifier, quote
from .listeners import BREAK, CONTINUE, RETURN, RETURN_SLOT, StepAbandoned

__all__ = ["StatementEmitters"]


class StatementEmitters:
    """The `emit_<Instruction>` methods of statements (a base class of `CodeGenerator`)."""

    def emit_FunctionInstruction(self, instr: FunctionInstruction) -> None:
        maker = self.const(self.ctx.closure_maker(instr, self.unit), "make_" + identifier(instr.function.name))
        self.leaf(instr, lambda: self.line(f"{self.var(instr.out_var)} = {maker}(f)"))

    def emit_ReturnInstruction(self, instr: ReturnInstruction) -> None:
        names = instr.out_vars
        if not names:
            value = "None"
        elif len(names) == 1 and not instr.as_tuple:
            value = self.var(names[0])
        else:
            value = "(" + ", ".join(self.var(n) for n in names) + ("," if len(names) == 1 else "") + ")"
        self.read_weights(names_read(instr))
        if self.generator:
            self.line(f"{self.helper('writeback', write_back)}(f, outer, {self.helper('nonlocal_vars', tuple(self.schema.nonlocal_vars))})")
            self.line("return")
            return
        if self.observed():
            self.line(f"f[{quote(RETURN_SLOT)}] = {value}")
            self.after(instr)
            if self.part_of is not None:
                self.line(f"return {self.helper('RETURN', RETURN)}")
            else:
                self.line(f"return f.pop({quote(RETURN_SLOT)})")
            return
        if self.logged():  # the root's return, with its frame (runtime/reporting.py)
            self.after(instr)
        if self.part_of is not None:
            self.line(f"f[{quote(RETURN_SLOT)}] = {value}")
            self.line(f"return {self.helper('RETURN', RETURN)}")
            return
        self.line(f"return {value}")

    def _loop_signal(self, instr: Instruction, word: str, signal: str) -> None:
        self.after(instr)
        if self.loops:
            self.line(word)
        else:  # inside a part, the loop is its caller's
            self.line(f"return {self.helper(signal, BREAK if signal == 'BREAK' else CONTINUE)}")

    def emit_BreakInstruction(self, instr: BreakInstruction) -> None:
        self._loop_signal(instr, "break", "BREAK")

    def emit_ContinueInstruction(self, instr: ContinueInstruction) -> None:
        self._loop_signal(instr, "continue", "CONTINUE")

    def emit_RaiseInstruction(self, instr: RaiseInstruction) -> None:
        self.read_weights(names_read(instr))
        self.announce(instr)
        if instr.exc is None:
            self.line("raise")
        elif instr.has_cause:
            self.line(f"raise {self.operand(instr.exc)} from {self.operand(instr.cause)}")
        else:
            self.line(f"raise {self.operand(instr.exc)}")

    def emit_YieldInstruction(self, instr: YieldInstruction) -> None:
        """`out = yield value`: the generated function is a generator function, as the source is, so
        `send`, `throw` and `close` (a `with` block's exception, `contextmanager`'s cleanup) reach
        the schema's own try/finally exactly as they reach the original's."""
        def write() -> None:
            out = self.var(instr.out_var) if instr.out_var else self.temp("sent")
            value = "" if instr.value is None else " " + self.operand(instr.value)
            self.line(f"{out} = yield{value}")
        self.leaf(instr, write)

    def emit_DeleteInstruction(self, instr: DeleteInstruction) -> None:
        def write() -> None:
            if self.frame:
                self.line(f"{self.helper('delete', delete_names)}(f, {self.const(tuple(instr.names), 'names')})")
            else:
                self.line("del " + ", ".join(self.var(n) for n in instr.names))
        self.leaf(instr, write)

    def emit_condition(self, instr: ControlInstruction, stepped: bool) -> None:
        """The instructions computing `cond_var`; an `if` test (or a `while` re-evaluation) is not a
        step: the observer is told it is a condition."""
        prepare = condition_instructions(instr)
        reads = [instr.cond_var] if instr.cond_var in self.weights else []
        if not prepare and not reads:
            return
        if self.observed() and not stepped:
            self.line(f"{self.helper('begin', self.observer.begin_condition)}()", instr)
            self.blocks += 1
            self.block("try:", lambda: (self.emit_list(prepare), self.read_weights(reads)), instr)
            self.block("finally:", lambda: self.line(f"{self.helper('end', self.observer.end_condition)}()", instr),
                       instr)
            self.blocks -= 1
        else:
            self.emit_list(prepare)
            self.current = instr
            self.read_weights(reads)
        self.current = instr

    def nested(self, instrs: list, loop: bool = False) -> Callable[[], None]:
        def write() -> None:
            saved = self.current
            if loop:
                self.loops += 1
            try:
                self.emit_list(instrs)
            finally:
                if loop:
                    self.loops -= 1
                self.current = saved
        return write

    def emit_ControlInstruction(self, instr: ControlInstruction) -> None:
        getattr(self, "emit_" + instr.kind)(instr)

    def emit_if(self, instr: ControlInstruction) -> None:
        self.emit_condition(instr, stepped=False)
        self.block(f"if {self.var(instr.cond_var)}:", self.nested(instr.body), instr)
        if instr.else_body:
            self.block("else:", self.nested(instr.else_body), instr)

    def emit_while(self, instr: ControlInstruction) -> None:
        state = self.fresh("tested")
        self.line(f"{state} = False", instr)
        self.blocks += 1

        def loop() -> None:
            if self.observed():  # the first test is a step, its re-evaluations are not
                self.block(f"if {state}:", lambda: self.emit_condition(instr, stepped=False), instr)
                self.block("else:", lambda: (self.line(f"{state} = True", instr),
                                            self.emit_condition(instr, stepped=True)), instr)
            else:
                self.emit_condition(instr, stepped=True)
            self.block(f"if not {self.var(instr.cond_var)}:",
                       lambda: (self.line(f"{state} = None", instr), self.line("break", instr)), instr)
            self.nested(instr.body, loop=True)()

        self.block("while True:", loop, instr)
        self.blocks -= 1
        if instr.else_body:
            self.block(f"if {state} is None:", self.nested(instr.else_body), instr)

    def emit_for(self, instr: ControlInstruction) -> None:
        self.emit_condition(instr, stepped=True)
        position = self.fresh("position") if instr.index_var is not None else None
        if position is not None:
            self.line(f"{position} = 0", instr)
        target = self.var(instr.bind_var)
        self.blocks += 1

        def body() -> None:
            if position is not None:
                self.line(f"{self.var(instr.index_var)} = {position}", instr)
                self.line(f"{position} += 1", instr)
            self.nested(instr.body, loop=True)()

        self.block(f"for {target} in {self.var(instr.cond_var)}:", body, instr)
        if instr.else_body:
            self.block("else:", self.nested(instr.else_body), instr)
        self.blocks -= 1

    def emit_TryInstruction(self, instr: TryInstruction) -> None:
        self.blocks += 3
        observed = self.observed()

        def convert(body: Callable[[], None]) -> Callable[[], None]:
            """In a frame-dict function, an unbound read (a KeyError of `f`) is a NameError for
            the handlers and before `finally` runs (it may bind the name)."""
            if not self.frame:
                return body

            def write() -> None:
                missed = self.fresh("missed")

                def handle() -> None:
                    self.line(f"{missed} = {self.helper('unbound', unbound_for_handlers)}({missed}, f)", instr)
                    self.line(f"if {missed} is None:", instr)
                    self.line("    raise", instr)
                    self.line(f"raise {missed} from None", instr)

                self.block("try:", body, instr)
                self.block(f"except {self.helper('KeyError', KeyError)} as {missed}:", handle, instr)

            return write

        def handlers() -> None:
            if instr.handlers:
                body = self.nested(instr.body)

                def handled_body() -> None:
                    self.handled += 1  # names read here raise NameError itself, for the handlers
                    try:
                        body()
                    finally:
                        self.handled -= 1

                self.block("try:", convert(handled_body), instr)
                if observed:
                    self.block(f"except {self.helper('StepAbandoned', StepAbandoned)}:",
                               lambda: self.line("raise", instr), instr)
                for classes, name, body in zip(instr.handlers, instr.handler_names, instr.handler_bodies):
                    self.handler(instr, classes, name, body)
                if instr.else_body:
                    self.block("else:", self.nested(instr.else_body), instr)
            else:
                self.nested(instr.body)()
                self.nested(instr.else_body)()

        if instr.final_body:
            self.block("try:", convert(handlers), instr)
            self.block("finally:", self.nested(instr.final_body), instr)
        else:
            handlers()
        self.blocks -= 3

    def handler(self, instr: TryInstruction, classes: tuple, name: Optional[str], body: list) -> None:
        clause = "except" if not classes else f"except {self.const(tuple(classes), 'handled')}"
        if name is None:
            self.block(clause + ":", self.nested(body), instr)
        elif not self.frame:
            self.block(f"{clause} as {self.var(name)}:", self.nested(body), instr)
        else:
            caught = self.fresh("caught")

            def bound() -> None:
                self.line(f"f[{quote(name)}] = {caught}", instr)
                self.block("try:", self.nested(body), instr)
                self.block("finally:", lambda: self.line(f"f.pop({quote(name)}, None)", instr), instr)

            self.block(f"{clause} as {caught}:", bound, instr)

    def emit_WithInstruction(self, instr: WithInstruction) -> None:
        self.blocks += 1
        context = self.var(instr.context_var)
        if instr.bind_var is None:
            self.block(f"with {context}:", self.nested(instr.body), instr)
        else:
            self.block(f"with {context} as {self.var(instr.bind_var)}:", self.nested(instr.body), instr)
        self.blocks -= 1

    def emit_part(self, instr: Instruction) -> None:
        """A compound statement nested past Python's limits, compiled as a function of its own over
        the same frame; its break/continue/return come back as signals."""
        part = self.ctx.part(self.unit, [instr])
        signal = self.fresh("signal")
        self.line(f"{signal} = {self.const(part, 'part')}(f)", instr)

        def passes() -> None:
            if self.loops:
                self.line(f"if {signal} is {self.helper('BREAK', BREAK)}:", instr)
                self.line("    break", instr)
                self.line(f"if {signal} is {self.helper('CONTINUE', CONTINUE)}:", instr)
                self.line("    continue", instr)
            if self.part_of is not None:
                self.line(f"return {signal}", instr)
            elif self.observed() or self.frame:
                self.line(f"return f.pop({quote(RETURN_SLOT)})", instr)

        self.block(f"if {signal} is not None:", passes, instr)
