"""What generated code reports as it runs: the observer's calls, a counted run's counts, a logged run's log.

`ReportEmitters` is a part of `codegen.CodeGenerator` (a base class of it), kept in a module of its
own: the lines written around an instruction that tell someone it ran. A program is one of:

- **observed** (`ctx.observer`): `before(instr, f)` ahead of an instruction that may change its
  operands in place, `after(instr, f)` after each leaf (only where a tensor was bound, with
  `ctx.tensor_results`; `after(sites, k, f, value)` for an observer that takes the site,
  `Observer.after_takes_site`: a stepped run's), `before_call` ahead of sub-block calls
  (`ctx.observe_calls`);
- **counted** (`ctx.counter`, runtime/partial.py): `counter[0] += 1` where an observed run would
  report a tensor;
- **logged** (`ctx.log`, a `step_log.StepLog`, runtime/step_log.py): plain code (fast locals) that
  appends `(instruction, value, version)` to the run's log where an observed run would report a
  tensor (with the callee read at run time, `(instruction, value, version, callee)`, where the
  step's description depends on it), calls `log.before(instr, names)` ahead of an instruction that
  may change its operands in place, and marks each block's entry and exit (`(unit, position)`,
  `(None, position)`) in `log.marks`, so the depth and block path of every step are known after
  the run. The root block keeps a frame dict and logs it with the return that ran
  (`log.returns`, with `(None, frame)` at its entry): the recorder's root scope. A *kept* logged
  program (`ctx.log_plan`, a `log_plan.LogPlan`) counts every tensor result in `log.count[0]` and
  appends only those its plan keeps, with their number (`log_kept`);
- **plain**: none of these.

Depends on the schema, `instructions`, `functions` (the names an instruction reads), `listeners` (the
return slot) and `log_plan`.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ..schema.model import BlockInstruction, Instruction, OpInstruction, ReturnInstruction, VarRef
from .functions import names_read
from .instructions import NOT_TENSOR_TYPES, never_tensor, quote
from .listeners import RETURN_SLOT
from .log_plan import KeptIds

__all__ = ["ReportEmitters"]


class ReportEmitters:
    """The report lines of generated code (a base class of `CodeGenerator`)."""

    def observed(self) -> bool:
        return self.observer is not None

    def logged(self) -> bool:
        """A logged program's code (never observed): tensor results go to the run's log."""
        return self.observer is None and getattr(self.ctx, "log", None) is not None

    def before(self, instr: Instruction) -> None:
        if not getattr(instr, "mutates", False):
            return
        if self.observed():
            self.line(f"{self.helper('before', self.observer.before)}({self.instr_name(instr)}, f)")
        elif self.logged():
            if self.frame:
                names = "f"
            else:  # what `mutated_tensors` reads of the frame, as a dict of the names the instruction reads
                names = "{" + ", ".join(f"{quote(n)}: {self.var(n)}" for n in dict.fromkeys(names_read(instr))) + "}"
            self.line(f"{self.helper('log_before', self.ctx.log.before)}({self.instr_name(instr)}, {names})")

    def after(self, instr: Instruction) -> None:
        if not self.observed():
            if self.logged():
                self.log_after(instr)
                return
            counter = getattr(self.ctx, "counter", None)
            if counter is not None and isinstance(instr, (OpInstruction, BlockInstruction)) and instr.out_var \
                    and not never_tensor(instr):
                # a counted plain run: how many tensors an observed run would have reported here
                self.line(f"if {self.is_tensor(self.var(instr.out_var))}:")
                self.line(f"    {self.helper('counted', counter)}[0] += 1")
            return
        after = self.helper("after", self.observer.after)
        sited = getattr(self.observer, "after_takes_site", False)
        if self.ctx.tensor_results and not isinstance(instr, ReturnInstruction):
            out = instr.out_var
            if out and not never_tensor(instr):  # the observer hears of tensor results only
                value = self.temp("value")
                self.line(f"{value} = f.get({quote(out)})")
                self.line(f"if {self.is_tensor(value)}:")
                where = f"{self.site(instr)}, f, {value}" if sited else f"{self.instr_name(instr)}, f"
                self.line(f"    {after}({where})")
            return
        where = f"{self.site(instr)}, f, {self.bound_value(instr)}" if sited else f"{self.instr_name(instr)}, f"
        self.line(f"{after}({where})")

    def site(self, instr: Instruction) -> str:
        """`sites, k`: the function's list of reported instructions and `instr`'s index in it
        (for an observer whose `after` takes a site, `Observer.after_takes_site`)."""
        sites = self.helper("sites", [])
        index = self.__dict__.setdefault("_site_index", {})
        k = index.get(id(instr))
        if k is None:
            listed = self.env[sites]
            k = index[id(instr)] = len(listed)
            listed.append(instr)
        return f"{sites}, {k}"

    def bound_value(self, instr: Instruction) -> str:
        """The value `instr` bound, as an expression over the frame `f` (for an observer whose
        `after` takes it): its variable's, a return's waiting value, else None."""
        if instr.out_var:
            return f"f.get({quote(instr.out_var)})"
        if isinstance(instr, ReturnInstruction):
            return f"f.get({quote(RETURN_SLOT)})"
        return "None"

    def log_after(self, instr: Instruction) -> None:
        """A logged program's line after `instr`: the tensor it bound, where an observed capture
        would report one (the same instructions: `CodeGenerator.emit_list` fuses the same calls)."""
        log = self.ctx.log
        if isinstance(instr, ReturnInstruction):
            if self.frame and not self.generator and self.unit.is_block \
                    and self.unit.block is self.ctx.root:
                self.line(f"{self.helper('log_return', log.returns.append)}(({self.instr_name(instr)}, f))")
            return
        out = instr.out_var
        if not out or never_tensor(instr) or not isinstance(instr, (OpInstruction, BlockInstruction)):
            return  # only what an op or a block call binds becomes a step (`ActivationRecorder._took`)
        value = self.var(out)
        callee = ""
        if isinstance(instr, OpInstruction) and isinstance(instr.target, VarRef):
            callee = self.var(instr.target.name)  # what the step's description reads
        elif isinstance(instr, BlockInstruction) and instr.callee_var is not None:
            callee = self.var(instr.callee_var)
        plan = getattr(self.ctx, "log_plan", None)
        if plan is not None:
            self.log_kept(instr, value, callee, plan.decision(instr, self.unit))
            return
        self.line(f"if {self.is_tensor(value)}:")
        self.line(f"    {self.helper('log', log.steps.append)}(({self.instr_name(instr)}, {value}, "
                  f"{value}._version{', ' + callee if callee else ''}))")

    def log_kept(self, instr: Instruction, value: str, callee: str, decision: Any) -> None:
        """A kept logged program's lines (runtime/step_log.py): every tensor result counted, the
        kept ones logged with their number, as the plan decided (`decision`)."""
        log = self.ctx.log
        count = self.helper("count", log.count)
        self.line(f"if {self.is_tensor(value)}:")
        self.line(f"    {count}[0] += 1")
        if decision is False:
            return
        entry = f"({self.instr_name(instr)}, {value}, {value}._version, {count}[0]{', ' + callee if callee else ''})"
        append = self.helper('log', log.steps.append)
        if decision is True:
            self.line(f"    {append}({entry})")
            return
        if not callee:
            raise TypeError(f"a run-time keep decision for an instruction without a callee read at run time: {instr!r}")
        if isinstance(decision, KeptIds):
            test = "not in" if decision.default else "in"
            self.line(f"    if {self.helper('id', id)}({callee}) {test} {self.const(decision.ids, 'kept_ids')}:")
        else:
            self.line(f"    if {self.const(decision, 'keeps')}({callee}):")
        self.line(f"        {append}({entry})")

    def log_marks(self) -> tuple[list, list]:
        """(lines before the function's `try`, lines of its `finally`): a logged block's entry and
        exit marks (none for parts, generator-expression helpers and closures, which the
        `InterpretedFunction` marks itself)."""
        if not self.logged() or self.part_of is not None or self.generator or not self.unit.is_block:
            return [], []
        log = self.ctx.log
        mark, steps, size = self.helper("mark", log.marks.append), self.helper("steps", log.steps), \
            self.helper("len", len)
        unit = self.helper("unit", self.unit)
        entry = [f"{mark}(({unit}, {size}({steps})))"]
        if self.frame and self.unit.block is self.ctx.root:  # the root's frame, before any return
            entry.append(f"{self.helper('log_return', log.returns.append)}((None, f))")
        return entry, [f"{mark}((None, {size}({steps})))"]

    def is_tensor(self, value: str) -> str:
        """A test of `isinstance(value, Tensor)`, written to be quick for tensors and for the common
        values that are not (numbers, tuples, methods: `NOT_TENSOR_TYPES`)."""
        tensor, kind = self.helper("Tensor", Tensor), self.helper("type", type)
        return (f"{value}.__class__ is {tensor} or {kind}({value}) not in {self.helper('not_tensor', NOT_TENSOR_TYPES)} "
                f"and {self.helper('isinstance', isinstance)}({value}, {tensor})")

    def instr_name(self, instr: Instruction) -> str:
        names = self.__dict__.setdefault("_instr_names", {})
        name = names.get(id(instr))
        if name is None:
            name = names[id(instr)] = self.const(instr, "i")
        return name

    def announce(self, instr: Instruction) -> None:
        if self.observed() and self.ctx.observe_calls:
            announce = self.ctx.announcer(instr, self.unit)
            if announce is not None:
                self.line(f"{self.const(announce, 'announce')}(f)")

    # what the code generator provides
    observer: Any
    ctx: Any
