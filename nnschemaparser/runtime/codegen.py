"""The code generator: each function of a schema becomes one real Python function.

`CodeGenerator` writes the source of one `FunctionSchema` (a forward, a method, a closure) compiled
for one block and one program mode, the way `ast.NodeVisitor` and torch.fx's codegen are organised:
each instruction kind has one `emit_<Instruction>` that alone says how that instruction runs, for
plain runs, observed runs (captures, stepping, pauses before calls) and generator expressions.
The result reads like the forward it came from:

    def forward(self, x):
        hidden = _fc1((x,), {}) if _children.get('fc1') is _fc1_module else _live_call(...)
        activated = hidden.relu()
        ...

Two ways of keeping variables:

- **locals** (plain runs): the function takes the forward's own parameters (CPython binds them,
  with its own errors) and every variable is a fast local named as in the source (temporaries `$t3`
  become `_t3`); control flow is Python's own `if` / `for` / `while` / `try` / `with`.
- **frame** (observed runs, and any function defining closures, whose variables the closures read
  late): variables live in a dict `f` the observer, the stepper's edits and the closures see;
  the observer's calls are written between the instructions.

The generated code is compiled with the user's file name and each line's position set to the
source position of the instruction it runs, so a traceback through an interpreted forward shows
`File "model.py", line 12, in forward` with the line the user wrote (and its carets), and pdb,
py-spy and cProfile attribute frames to the model's own lines. Identical functions (the 32 layers of
a stack) are compiled once; each gets its own copy of the code object (CPython's specialized global
reads are per code object and per globals dict) and its own globals (`env`: the callables,
constants, weights' dicts and helpers the text names). An exception passing through a generated frame gets one note
(`functions.failure`) naming the source text of the instruction that was running.

A program made for `torch.compile` (`ctx.traceable`, `traces/compile_regions.TraceableProgram`) gets
code dynamo traces without a graph break: no `try` wrapper (dynamo cannot resume inside one), a
tensor's method called without asking whether it is a module, a value called as is while dynamo
traces. Plain programs never set it and generate what they always did.

One visitor class with its bases: the emitters of calls (ops, method calls, block calls) are here;
those of the other statements (return, raise, yield, del, loop signals, closures, if / while / for
/ try / with, parts) are `statements.StatementEmitters`; what generated code reports (the
observer's calls, a counted run's counts, a logged run's log) is `reporting.ReportEmitters`; live
reads of names and the guard at the top are `reads.ReadEmitters`. What it reads off instructions
beforehand is `instructions`, what generated code calls is `functions`.

Depends on the schema, `binding`, `instructions`, `reads`, `reporting`, `statements` and `functions`.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import operator
import types
from typing import Any, Callable, Optional

import torch.compiler
from torch import Tensor, nn

from ..schema.model import (BlockInstruction, Const, ControlInstruction, FunctionSchema, Instruction,
                            OpInstruction, SliceOf, TryInstruction, VarRef, WithInstruction)
from .binding import merge_kwargs
from .functions import (META_KEY, FunctionMeta, call_live, failure, names_read, read_global, refresh_free_vars,
                        register_lines, weight_attribute, write_back)
from .instructions import (MAX_BLOCKS, MAX_INDENT, bound_names, fusable_method_call, identifier, is_element, literal,
                           position, quote, walk_instructions)
from .reads import ReadEmitters
from .reporting import ReportEmitters
from .statements import StatementEmitters

__all__ = ["CodeGenerator", "Generated"]

_Module = nn.Module
_CURRENT = object()  # a line stands for the instruction being written


# Calls of these callables are written as the operator itself (`operator.add(a, b)` is `a + b`:
# the same C slot, the same errors), so the generated code pays no call for them.
_OPERATORS = {operator.add: "{0} + {1}", operator.sub: "{0} - {1}", operator.mul: "{0} * {1}",
              operator.truediv: "{0} / {1}", operator.floordiv: "{0} // {1}", operator.mod: "{0} % {1}",
              operator.pow: "{0} ** {1}", operator.matmul: "{0} @ {1}", operator.and_: "{0} & {1}",
              operator.or_: "{0} | {1}", operator.xor: "{0} ^ {1}", operator.lshift: "{0} << {1}",
              operator.rshift: "{0} >> {1}", operator.neg: "-{0}",
              operator.pos: "+{0}", operator.invert: "~{0}", operator.not_: "not {0}", operator.is_: "{0} is {1}",
              operator.is_not: "{0} is not {1}", operator.eq: "{0} == {1}", operator.ne: "{0} != {1}",
              operator.lt: "{0} < {1}", operator.le: "{0} <= {1}", operator.gt: "{0} > {1}", operator.ge: "{0} >= {1}"}


class Generated:
    """One function compiled from generated text: the callable, its text, and what it was made of."""

    __slots__ = ("function", "source", "mode", "filename", "positions")

    def __init__(self, function: Callable, source: str, mode: str, filename: str, positions: tuple = ()):
        self.function = function
        self.source = source
        self.mode = mode
        self.filename = filename
        self.positions = positions  # each line's source position (what `recompile` puts back)


_CODE_CACHE: dict = {}


class CodeGenerator(ReadEmitters, ReportEmitters, StatementEmitters):
    """Writes and compiles one function of a schema (see the module docstring).

    `ctx` is the program's side of the bargain (a `program.Program`): `observer`, `tensor_results`,
    `observe_calls`, and the helpers the generated calls use (`call_value`, `static_call`,
    `lazy_invoker`, `closure_maker`, `announcer`, `part`)."""

    def __init__(self, ctx: Any, unit: Any, frame: bool, generator: bool = False, part_of: Any = None):
        self.ctx = ctx
        self.unit = unit
        self.schema: FunctionSchema = unit.schema
        self.frame = frame  # variables in the dict `f` (else fast locals)
        self.generator = generator  # a generator expression's helper: elements are yielded
        self.part_of = part_of  # a deep compound statement compiled apart: signals are returned
        self.observer = ctx.observer
        self.lines: list[tuple[str, Optional[Instruction]]] = []
        self.env: dict = {"__builtins__": builtins.__dict__}
        self.local_names: dict[str, str] = {}
        self.taken: set[str] = set()
        self.loops = 0  # loops open at the current point (break/continue go to Python's own)
        self.blocks = 0
        self.indent = 1
        self.current: Optional[Instruction] = None
        if frame:
            self.taken.update(("f", "outer"))
        else:
            self._reserve_locals()
        self.weights = dict(unit.weights)
        self.direct_weights = unit.direct_weights
        self.handled = 0  # `try` bodies with handlers open at the current point (see `bound_const`)

    # -- names --------------------------------------------------------------------------------

    def _reserve_locals(self) -> None:
        schema = self.schema
        names = list(schema.params) + list(schema.kwonly) + [n for n in (schema.vararg, schema.kwarg) if n]
        if self.unit.self_name:
            names.insert(0, self.unit.self_name)
        names += [ref for ref, _ in self.unit.weights]
        for instr in walk_instructions(schema.body):
            names.extend(bound_names(instr))
            names.extend(names_read(instr))
        plain = [n for n in names if type(n) is str and n.isidentifier() and not keyword.iskeyword(n)]
        self.taken.update(plain)
        for name in plain:
            self.local_names[name] = name
        for name in names:
            if name not in self.local_names:
                self.local_names[name] = self.fresh(name)

    def fresh(self, base: str) -> str:
        """A new name no variable of the function and no other helper uses."""
        base = "_" + identifier(base)
        name, k = base, 1
        while name in self.taken or keyword.iskeyword(name) or hasattr(builtins, name):
            k += 1
            name = f"{base}{k}"
        self.taken.add(name)
        return name

    def temp(self, kind: str) -> str:
        """A local of the generated code's own (one per kind: `_method`, `_callee`)."""
        return self.helper_name("temp " + kind, lambda: self.fresh(kind))

    def helper_name(self, key: str, make: Callable[[], str]) -> str:
        names = self.__dict__.setdefault("_helpers", {})
        name = names.get(key)
        if name is None:
            name = names[key] = make()
        return name

    def const(self, value: Any, base: str) -> str:
        """A global of the generated function holding `value`."""
        name = self.fresh(base)
        self.env[name] = value
        return name

    def var(self, name: str) -> str:
        """Source reading (or, as a target, binding) the variable `name`."""
        if type(name) is not str:
            raise TypeError(f"variable names must be strings, not {type(name).__name__}")
        if self.frame:
            return f"f[{quote(name)}]"
        local = self.local_names.get(name)
        if local is None:
            local = self.local_names[name] = self.fresh(name)
        return local

    # -- writing --------------------------------------------------------------------------------

    def line(self, text: str, instr: Any = _CURRENT) -> None:
        """One line of the function, standing for `instr` (default: the instruction being written;
        None: no instruction, the line of the `def`)."""
        self.lines.append(("    " * self.indent + text, self.current if instr is _CURRENT else instr))

    def block(self, header: str, body: Callable[[], None], instr: Any = _CURRENT) -> None:
        self.line(header, instr)
        self.indent += 1
        start = len(self.lines)
        body()
        if len(self.lines) == start:
            self.line("pass")
        self.indent -= 1

    # -- operands --------------------------------------------------------------------------------

    def operand(self, op: Any, subscript: bool = False) -> str:
        if isinstance(op, VarRef):
            return self.var(op.name)
        if isinstance(op, Const):
            if op.binding is not None:
                return self.bound_const(op.value, op.binding, op.text or "const")
            text = literal(op.value)
            if text is not None and type(op.value) is not tuple:
                return text
            return self.const(op.value, op.text or "const")
        if isinstance(op, SliceOf):
            parts = [("" if p is None else self.operand(p)) for p in (op.lower, op.upper, op.step)]
            if subscript:
                text = f"{parts[0]}:{parts[1]}"
                return text + (f":{parts[2]}" if op.step is not None else "")
            return f"{self.helper('slice', slice)}({', '.join(p if p else 'None' for p in parts)})"
        if isinstance(op, tuple):
            if subscript and op and not any(isinstance(p, tuple) and not p for p in op):
                inner = [self.operand(p, subscript=True) for p in op]
                return ", ".join(inner) + ("," if len(inner) == 1 else "")
            text = literal(op)
            if text is not None:
                return text
            inner = [self.operand(p) for p in op]
            return "(" + ", ".join(inner) + ("," if len(inner) == 1 else "") + ")"
        if isinstance(op, list):
            return "[" + ", ".join(self.operand(p) for p in op) + "]"
        if isinstance(op, dict):
            return "{" + ", ".join(f"{self.operand(k)}: {self.operand(v)}" for k, v in op.items()) + "}"
        text = literal(op)
        if text is not None:
            return text
        return self.const(op, type(op).__name__)

    def arguments(self, instr: Any, callee: str) -> tuple[str, str]:
        """(`call`, `lists`): the call's own argument text (`a, *b, dim=c, **kw`) and the same as
        `(a, *b), {'dim': c}` for the invokers, which take (args, kwargs)."""
        for key in instr.kwargs:
            if type(key) is not str:
                raise TypeError(f"keywords must be strings, not {type(key).__name__}")
        stars = set(instr.star_args)
        positional = [("*" if i in stars else "") + self.operand(op) for i, op in enumerate(instr.args)]
        if instr.args_var is not None:
            positional.append("*" + self.var(instr.args_var))
        pairs = [(key, self.operand(op)) for key, op in instr.kwargs.items()]
        plain = all(k.isidentifier() and not keyword.iskeyword(k) for k, _ in pairs)
        display = "{" + ", ".join(f"{quote(k)}: {text}" for k, text in pairs) + "}"
        if instr.kwargs_var is not None:
            merged = f"{self.const(merge_kwargs, 'merge_kwargs')}({display}, {self.var(instr.kwargs_var)}, " \
                     f"lambda: {callee})"
        else:
            merged = display
        tuple_text = "(" + ", ".join(positional) + ("," if len(positional) == 1 else "") + ")"
        own = [f"{k}={text}" for k, text in pairs] if plain else (["**" + display] if pairs else [])
        if instr.kwargs_var is not None:
            own.append("**" + self.var(instr.kwargs_var))
        return ", ".join([*positional, *own]), f"{tuple_text}, {merged}"

    # -- weights --------------------------------------------------------------------------------

    def read_weights(self, names: list) -> None:
        """Live reads of the registered weights among `names`, before the instruction reading them:
        forward may reassign them (`self.b = ...`, `register_buffer`), as Module.__getattr__ sees."""
        if not self.weights or not names:
            return
        for ref in dict.fromkeys(names):
            attr = self.weights.get(ref)
            if attr is None:
                continue
            module = self.module_name()
            if self.direct_weights:
                params = self.helper("params", getattr(self.unit.module, "_parameters", {}))
                read = self.helper("attribute", weight_attribute)
                self.line(f"{self.var(ref)} = {params}[{quote(attr)}] if {quote(attr)} in {params} else "
                          f"{read}({module}, {quote(attr)})")
            else:
                self.line(f"{self.var(ref)} = {self.helper('getattr', getattr)}({module}, {quote(attr)})")

    def helper(self, key: str, value: Any) -> str:
        """A global shared by the whole function (one name per helper)."""
        return self.helper_name(key, lambda: self.const(value, key))

    def module_name(self) -> str:
        return self.helper("module", self.unit.module)

    # -- the function ------------------------------------------------------------------------------

    def generate(self) -> Generated:
        schema = self.schema
        name = identifier(schema.name.strip("<>"))
        if keyword.iskeyword(name):
            name += "_"
        if self.part_of is not None:
            params = "f"
        elif self.frame:
            params = "f, outer" if self.generator else "f"
        else:
            params = self.signature()
        err = self.fresh("error")
        self.indent = 2
        self.emit_list(schema.body if self.part_of is None else self.part_of)
        if not self.lines:
            self.line("pass")
        body = self.lines
        self.lines = []
        self.indent = 0
        self.line(f"def {name}({params}):", None)
        self.indent = 1
        entry, exit_ = self.log_marks()  # a logged block marks its entry and exit (runtime/reporting.py)
        for text in entry:
            self.line(text, None)
        # dynamo cannot resume after a graph break inside a `try`: a traceable program's code has none
        traceable = getattr(self.ctx, "traceable", False)
        self.line("if True:" if traceable else "try:", None)
        self.guard_lines()  # a part checks what it reads too: it runs when its statement runs
        if self.generator:
            refresh = self.helper("refresh", refresh_free_vars)
            self.line(f"    {refresh}(f, outer, {self.helper('free_vars', tuple(schema.free_vars))})", None)
        self.lines.extend(body)
        if traceable:
            return self.compile(name)
        failing = self.const(failure, "failure")
        base = self.helper("BaseException", BaseException)
        self.line(f"except {base} as {err}:", None)
        self.line(f"    {err} = {failing}({err}, {'f' if self.frame else 'None'})", None)
        self.line(f"    if {err} is None:", None)
        self.line("        raise", None)
        self.line(f"    raise {err} from None", None)
        if exit_:
            self.line("finally:", None)
            for text in exit_:
                self.line("    " + text, None)
        return self.compile(name)

    def signature(self) -> str:
        schema, unit = self.schema, self.unit
        parts = []
        if unit.self_name is not None:
            parts.append(self.var(unit.self_name))
        defaults = schema.defaults
        for p in schema.params:
            parts.append(self.var(p) + (f"={self._default_text(defaults[p])}" if p in defaults else ""))
        if schema.vararg:
            parts.append("*" + self.var(schema.vararg))
        elif schema.kwonly:
            parts.append("*")
        for p in schema.kwonly:
            parts.append(self.var(p) + (f"={self._default_text(defaults[p])}" if p in defaults else ""))
        if schema.kwarg:
            parts.append("**" + self.var(schema.kwarg))
        return ", ".join(parts)

    @staticmethod
    def _default_text(value: Any) -> str:
        text = literal(value)
        return text if text is not None else "..."

    def compile(self, name: str) -> Generated:
        schema = self.schema
        filename = schema.filename or f"<nnschemaparser {self.unit.label}>"
        text = "\n".join(line for line, _ in self.lines) + "\n"
        firstline = schema.firstlineno or 1
        positions = [position(instr, firstline) for _, instr in self.lines]
        key = (text, filename, tuple(positions), name)
        code = _CODE_CACHE.get(key)
        if code is None:
            tree = ast.parse(text)
            for node in ast.walk(tree):
                if hasattr(node, "lineno") and node.lineno is not None:
                    lineno, end_lineno, col, end_col = positions[node.lineno - 1]
                    node.lineno, node.end_lineno, node.col_offset, node.end_col_offset = \
                        lineno, end_lineno, col, end_col
            module_code = builtins.compile(tree, filename, "exec")
            code = next(c for c in module_code.co_consts if hasattr(c, "co_code"))
            if len(_CODE_CACHE) > 20000:
                _CODE_CACHE.clear()
            _CODE_CACHE[key] = code
        instructions: dict = {}
        for (line, instr), where in zip(self.lines, positions):
            if instr is not None:
                bucket = instructions.setdefault(where, [])
                if not any(known is instr for known in bucket):  # by identity: instructions compare by value
                    bucket.append(instr)
        self.env[META_KEY] = FunctionMeta(self.unit, instructions, text)
        # A function of its own code object: what a shared one would save is the compile, done once
        # all the same (the cache above), and sharing costs the runs: CPython specializes a code
        # object's global reads for one globals dict, and the 32 layers of a stack each have their
        # own (`env`), so a shared object's inline caches miss at every layer (1.5-5 points of eager in a plain run
        # of the tiny Llama, bench/bench_codegen_sharing.py).
        function = types.FunctionType(code.replace(), self.env, name)
        if not self.frame and self.part_of is None:
            defaults = schema.defaults
            function.__defaults__ = tuple(defaults[p] for p in schema.params if p in defaults) or None
            kw = {p: defaults[p] for p in schema.kwonly if p in defaults}
            function.__kwdefaults__ = kw or None
        function.__qualname__ = self.unit.qualname
        register_lines(filename, self.lines)
        return Generated(function, text, "frame" if self.frame else "locals", filename, tuple(positions))

    # -- instruction lists ------------------------------------------------------------------------

    def emit_list(self, instrs: list) -> None:
        index = 0
        observed = self.observed()
        while index < len(instrs):
            instr = instrs[index]
            nxt = instrs[index + 1] if index + 1 < len(instrs) else None
            reports = observed or self.logged()  # fused as an observed capture fuses, so both report the same steps
            if nxt is not None and (not observed or self.ctx.tensor_results) and fusable_method_call(instr, nxt) \
                    and not (reports and nxt.mutates) and not self.generator:
                self.current = nxt
                self.read_weights(names_read(instr) + names_read(nxt))
                self.emit_method_call(instr, nxt)
                self.after(nxt)
                index += 2
                continue
            self.current = instr
            if self.too_deep(instr):
                self.emit_part(instr)
            else:
                getattr(self, "emit_" + type(instr).__name__)(instr)
            # What follows a return, break, continue or raise never runs, but it is written all the
            # same: the names it binds are locals of the function, as in the source, so a read of one
            # raises UnboundLocalError as CPython does (not a NameError for a missing global).
            index += 1

    def too_deep(self, instr: Instruction) -> bool:
        if not self.frame or not isinstance(instr, (ControlInstruction, TryInstruction, WithInstruction)):
            return False
        return self.blocks + 3 >= MAX_BLOCKS or self.indent + 4 >= MAX_INDENT

    def leaf(self, instr: Instruction, write: Callable[[], None]) -> None:
        """An instruction that runs and is reported: weights read, announced, before/after."""
        self.read_weights(names_read(instr))
        self.announce(instr)
        self.before(instr)
        write()
        self.after(instr)

    # -- one emitter per instruction ----------------------------------------------------------------

    def emit_OpInstruction(self, instr: OpInstruction) -> None:
        if self.generator and is_element(instr):
            self.read_weights(names_read(instr))
            self.line(f"{self.helper('writeback', write_back)}(f, outer, {self.helper('nonlocal_vars', tuple(self.schema.nonlocal_vars))})")
            self.line(f"yield {self.operand(instr.args[1])}")
            self.line(f"{self.helper('refresh', refresh_free_vars)}(f, outer, {self.helper('free_vars', tuple(self.schema.free_vars))})")
            return
        self.leaf(instr, lambda: self.write_op(instr))

    def write_op(self, instr: OpInstruction) -> None:
        out = self.var(instr.out_var) if instr.out_var else self.temp("unused")
        target = instr.target
        if isinstance(target, VarRef):
            callee = self.temp("callee")
            call, lists = self.arguments(instr, callee)
            self.line(f"{callee} = {self.var(target.name)}")
            dispatch = (f"{self.helper('call_value', self.ctx.call_value)}({callee}, {lists}) "
                        f"if {self.helper('isinstance', isinstance)}({callee}, {self.helper('Module', _Module)}) "
                        f"else {callee}({call})")
            if getattr(self.ctx, "traceable", False):  # under dynamo: called as is (see emit_method_call)
                compiling = self.helper("is_compiling", torch.compiler.is_compiling)
                dispatch = f"{callee}({call}) if {compiling}() else ({dispatch})"
            self.line(f"{out} = {dispatch}")
            return
        simple = not instr.kwargs and not instr.star_args and instr.args_var is None and instr.kwargs_var is None
        binding = getattr(instr, "binding", None)
        if binding is not None and binding.missing:  # a name no namespace had at parse time: looked up now
            space = self.helper_name(f"namespace {id(binding.namespace)}", lambda: self.const(binding.namespace, "globals"))
            self.line(f"{out} = {self.helper('read_global', read_global)}({space}, {quote(binding.key)})")
            return
        if simple and binding is None:  # a callee read through a name is called as read, never as an operator
            text = self.operator_text(target, instr.args)
            if text is not None:
                self.line(f"{out} = {text}")
                return
        base = instr.display_name or getattr(target, "__name__", "call")
        name = self.bound_const(target, binding, base) if binding is not None else self.const(target, base)
        through = getattr(self.ctx, "function_through", None)
        through = through(target) if through is not None else None
        if through is not None:  # a program that records or reuses function calls (runtime/reuse.py)
            _, lists = self.arguments(instr, name)
            self.line(f"{out} = {self.helper('through', through)}({name}, {lists})")
            return
        call, _ = self.arguments(instr, name)
        self.line(f"{out} = {name}({call})")

    def operator_text(self, target: Any, args: list) -> Optional[str]:
        try:
            template = _OPERATORS.get(target)
        except TypeError:  # an unhashable callable
            return None
        if target is operator.getitem and len(args) == 2:
            return f"{self.operand(args[0])}[{self.operand(args[1], subscript=True)}]"
        if template is None and target is getattr and len(args) == 2:
            name = _attribute_name(args[1])
            if name is not None:
                return f"{self.operand(args[0])}.{name}"
        if template is None or len(args) != template.count("{"):
            return None
        return template.format(*(self.operand(a) for a in args))

    def emit_method_call(self, fetch: OpInstruction, call: OpInstruction) -> None:
        """`$t = getattr(obj, 'm')` + `out = $t(...)` as `out = obj.m(...)` (a module's method goes
        through call_value, which runs its block)."""
        receiver = self.operand(fetch.args[0])
        name = _attribute_name(fetch.args[1])
        method = self.temp("method")
        bind = f"{self.var(fetch.out_var)} = " if self.observed() or self.logged() else ""
        if name is not None:
            self.line(f"{method} = {bind}{receiver}.{name}", fetch)
        else:
            self.line(f"{method} = {bind}{self.helper('getattr', getattr)}({receiver}, {quote(fetch.args[1])})", fetch)
        out = self.var(call.out_var) if call.out_var else self.temp("unused")
        args, lists = self.arguments(call, method)
        dispatch = (f"{self.helper('call_value', self.ctx.call_value)}({method}, {lists}) "
                    f"if {self.helper('isinstance', isinstance)}({method}, {self.helper('Module', _Module)}) "
                    f"else {method}({args})")
        if getattr(self.ctx, "traceable", False):
            # A program made for torch.compile (`ctx.traceable`, traces/compile_regions.py): dynamo cannot
            # tell the type of an intermediate tensor's bound method, so a tensor's method is called as is.
            dispatch = f"{method}({args}) if {self.helper('isinstance', isinstance)}({receiver}, " \
                       f"{self.helper('Tensor', Tensor)}) else ({dispatch})"
        self.line(f"{out} = {dispatch}", call)

    def emit_BlockInstruction(self, instr: BlockInstruction) -> None:
        self.leaf(instr, lambda: self.write_block_call(instr))

    def write_block_call(self, instr: BlockInstruction) -> None:
        out = self.var(instr.out_var) if instr.out_var else self.temp("unused")
        ref = instr.block_ref
        if instr.callee_var is not None:
            value = self.var(instr.callee_var)
            if ref.method is not None:
                value = f"{self.helper('getattr', getattr)}({value}, {quote(ref.method)})"
            _, lists = self.arguments(instr, value)
            self.line(f"{out} = {self.helper('call_value', self.ctx.call_value)}({value}, {lists})")
            return
        call = self.ctx.static_call(instr, self.unit, self.env)
        base = identifier((ref.path or "self").replace(".", "_") + ("_" + ref.method if ref.method else ""))
        if call.invoke is None:  # not in the schema (None at parse time, or replaced since): the live child
            live = self.const(call.live, "live_" + base)
            _, lists = self.arguments(instr, f"{live}()")
            self.line(f"{out} = {self.helper('call_live', call_live)}({live}(), {lists})")
            return
        invoke = self.fresh(base)
        self.env[invoke] = self.ctx.lazy_invoker(call.invoke, self.env, invoke)
        callee = self.const(call.callee, base + "_callee")
        _, lists = self.arguments(instr, f"{callee}()")
        if call.test is None:
            self.line(f"{out} = {invoke}({lists})")
            return
        expected = self.const(call.expected, base + "_module")
        if call.simple_test:
            check = f"{self.helper('children', call.test)}.get({quote(call.first)}) is {expected}"
        else:
            check = f"{self.const(call.test, 'current_' + base)}() is {expected}"
        live = self.const(call.live, "live_" + base)
        self.line(f"{out} = {invoke}({lists}) if {check} else "
                  f"{self.helper('call_value', self.ctx.call_value)}({live}(), {lists})")

def _attribute_name(op: Any) -> Optional[str]:
    value = op.value if isinstance(op, Const) else op
    if type(value) is str and value.isidentifier() and not keyword.iskeyword(value) and not value.startswith("__"):
        return value
    return None


def recompile(generated: Generated, env: dict, name: str, rewrite: Callable[[ast.Module], ast.Module]) -> Callable:
    """A variant of `generated`'s function: its text parsed again, positioned as the original, passed
    through `rewrite` (an `ast` transformer keeping positions), compiled over `env`. A stepped run of
    generators makes its block functions this way (runtime/step_generators.py)."""
    tree = ast.parse(generated.source)
    positions = generated.positions
    for node in ast.walk(tree):
        if hasattr(node, "lineno") and node.lineno is not None:
            node.lineno, node.end_lineno, node.col_offset, node.end_col_offset = positions[node.lineno - 1]
    tree = ast.fix_missing_locations(rewrite(tree))
    module_code = builtins.compile(tree, generated.filename, "exec")
    code = next(c for c in module_code.co_consts if hasattr(c, "co_code"))
    function = types.FunctionType(code, env, name)
    function.__qualname__ = generated.function.__qualname__
    return function
