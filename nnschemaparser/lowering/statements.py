"""Lowering: a forward's `ast` to schema instructions, statement by statement.

One `visit_<Stmt>` per CPython statement node, in the style of `ast.NodeVisitor`; expressions are
lowered by the `ExpressionLowering` mixin (expressions.py), nested `def`, `nonlocal` and imports by
the `DefinitionLowering` mixin (definitions.py), loops over module containers with the help of
`ContainerLoopLowering` (container_loops.py); scope.py finds the names a body binds. Anything without
a visitor falls to `generic_visit`, the one place that refuses, with the construct's name and
file:line. A refusal makes the parser re-dispatch that module to its real forward, so the schema
always runs. The entry points are `lower_function` and `lower_source`.

Depends on schema, intrinsics, source and errors; never on the runtime or any view.
"""

from __future__ import annotations

import ast
import builtins
import operator
from typing import Any, Callable, Optional

from . import intrinsics
from .definite_assignment import fragile_names
from ..schema.errors import UnsupportedSyntaxError
from .container_loops import ContainerLoopLowering
from .definitions import DefinitionLowering
from .expressions import ExpressionLowering
from .ops import op_instruction
from ..schema.model import (
    BreakInstruction,
    Const,
    ContinueInstruction,
    DeleteInstruction,
    FunctionSchema,
    Instruction,
    RaiseInstruction,
    ReturnInstruction,
    SourceLocation,
    TryInstruction,
    VarRef,
    WithInstruction,
)
from .context import LoweringContext, MethodRequest
from .scope import BindingCollector, arg_names
from .source import FunctionSource, function_source

__all__ = ["MethodRequest", "LoweringContext", "lower_function", "lower_source"]


def _closure_values(fn: Callable) -> dict[str, Any]:
    code = fn.__code__
    values = {}
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            values[name] = cell.cell_contents
        except ValueError:  # an empty cell: the name is not bound yet
            pass
    return values


def lower_function(fn: Callable, *, module: Any = None, owner: Optional[type] = None,
                   requests: Optional[list[MethodRequest]] = None) -> FunctionSchema:
    """Lower `fn` (a forward or method; unwrapped) to a FunctionSchema."""
    try:
        src = function_source(fn)
    except RecursionError:  # reading the source copies its tree, recursively
        code = fn.__code__
        raise UnsupportedSyntaxError(
            f"{fn.__qualname__} nests expressions or statements too deeply to lower; bind the inner parts to "
            "variables first", code.co_filename, code.co_firstlineno) from None
    ctx = LoweringContext(globals=fn.__globals__, closure=_closure_values(fn), module=module, owner=owner,
                          requests=requests if requests is not None else [],
                          cells=dict(zip(fn.__code__.co_freevars, fn.__closure__ or ())),
                          defaults=getattr(fn, "__defaults__", None), kwdefaults=getattr(fn, "__kwdefaults__", None))
    return _lower_bounded(lambda: FunctionLowering(ctx, src, src.node, enclosing=None, is_method=module is not None),
                          src)


def _lower_bounded(make: Callable[[], "FunctionLowering"], src: FunctionSource) -> FunctionSchema:
    """Lower, refusing code nested deeper than the lowering's recursion can follow."""
    try:
        return make().lower()
    except RecursionError:
        raise UnsupportedSyntaxError(
            "the function nests expressions or statements too deeply to lower; bind the inner parts to "
            "variables first", src.filename, src.node.lineno) from None


def lower_source(source: str, *, filename: str = "<lowering>", namespace: Optional[dict] = None) -> FunctionSchema:
    """Lower the first function definition of `source` without any module (for tools and fuzzing).

    Raises UnsupportedSyntaxError for what the lowering does not support; never another error for
    valid Python.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise UnsupportedSyntaxError(f"cannot parse the source: {type(exc).__name__}: {exc}", filename,
                                     getattr(exc, "lineno", None) or 1) from None
    node = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if node is None:
        raise UnsupportedSyntaxError("no function definition to lower", filename, 1)
    src = FunctionSource(node=node, filename=filename, firstlineno=1, lines=tuple(source.splitlines()))
    ctx = LoweringContext(globals=namespace if namespace is not None else {"__builtins__": builtins})
    return _lower_bounded(lambda: FunctionLowering(ctx, src, node, enclosing=None, is_method=False), src)


# --- the statement lowering -------------------------------------------------------------------


class FunctionLowering(DefinitionLowering, ExpressionLowering, ContainerLoopLowering):
    """Lowers one function body (and, recursively, the closures and comprehensions inside it)."""

    is_generator = False  # a top-level generator function (its body has `yield`)

    def __init__(self, ctx: LoweringContext, src: FunctionSource, node: Any, *,
                 enclosing: Optional["FunctionLowering"], is_method: bool, local_names: Optional[set] = None):
        self.ctx = ctx
        self.src = src
        self.node = node
        self.enclosing = enclosing
        self.is_method = is_method
        self.counter = [0] if enclosing is None else enclosing.counter
        self.current: list[Instruction] = []
        self.loop_depth = 0
        self.free_vars: set[str] = set()
        self.weight_refs: dict[str, str] = {}
        self.module_vars: dict[str, str] = {}
        self.module_index_vars: dict[str, Optional[str]] = {}  # loop variable -> the variable holding its position
        self.self_name: Optional[str] = None
        if local_names is None:
            collector = BindingCollector()
            body = node.body if isinstance(node.body, list) else [node.body]
            for stmt in body:
                collector.visit(stmt)
            if collector.delegates:
                raise self.refuse(node, "a 'yield from' or 'await' cannot be lowered")
            if collector.yields and (enclosing is not None or isinstance(node, ast.Lambda)):
                raise self.refuse(node, "a generator function (yield) nested in a forward cannot be lowered")
            self.is_generator = collector.yields
            if collector.globals:
                raise self.refuse(node, "a 'global' statement cannot be lowered")
            self.nonlocals = collector.nonlocals
            local_names = (collector.bound | set(arg_names(node.args))) - collector.nonlocals
            self.fragile = fragile_names(node)
        else:
            self.nonlocals = set()
            self.fragile = enclosing.fragile if enclosing is not None else set()  # a comprehension's
        self.locals = local_names

    # -- helpers ----------------------------------------------------------------------------

    def nested_lowering(self, node: Any, *, enclosing: Any, is_method: bool,
                        local_names: Optional[set] = None) -> "FunctionLowering":
        return FunctionLowering(self.ctx, self.src, node, enclosing=enclosing, is_method=is_method,
                                local_names=local_names)

    def refuse(self, node: ast.AST, message: str) -> UnsupportedSyntaxError:
        return UnsupportedSyntaxError(message, self.src.filename, getattr(node, "lineno", self.src.firstlineno))

    def new_temp(self) -> str:
        self.counter[0] += 1
        return f"$t{self.counter[0]}"

    def location(self, node: ast.AST) -> SourceLocation:
        lineno = getattr(node, "lineno", self.src.firstlineno)
        col = getattr(node, "col_offset", None)
        end_col = getattr(node, "end_col_offset", None)
        if col is None or end_col is None:
            return SourceLocation(self.src.filename, lineno, self.src.line_text(lineno))
        end_lineno = getattr(node, "end_lineno", None) or lineno
        return SourceLocation(self.src.filename, lineno, self.src.line_text(lineno), self.src.column(lineno, col),
                              end_lineno, self.src.column(end_lineno, end_col))

    def emit(self, instruction: Instruction, node: ast.AST) -> Instruction:
        if instruction.location is None:
            instruction.location = self.location(node)
        self.current.append(instruction)
        return instruction

    def nested(self, stmts: list[ast.stmt]) -> list[Instruction]:
        """Lower `stmts` into a fresh instruction list (a branch or loop body)."""
        saved = self.current
        self.current = []
        try:
            for stmt in stmts:
                self.visit(stmt)
            return self.current
        finally:
            self.current = saved

    def is_local(self, name: str) -> bool:
        return name in self.locals

    def lookup_enclosing(self, name: str) -> bool:
        """True when `name` is a variable of an enclosing lowered function (a closure read)."""
        scope = self.enclosing
        while scope is not None:
            if name in scope.locals or name in scope.free_vars:
                return True
            scope = scope.enclosing
        return False

    # -- entry ------------------------------------------------------------------------------

    def lower(self) -> FunctionSchema:
        node = self.node
        if isinstance(node, ast.AsyncFunctionDef):
            raise self.refuse(node, "an async function cannot be lowered")
        args = node.args
        positional = [a.arg for a in args.posonlyargs + args.args]
        if self.is_method:
            if not positional:
                raise self.refuse(node, "a method without a 'self' parameter cannot be lowered")
            self.self_name = positional[0]
            positional = positional[1:]
        defaults: dict[str, Any] = {}
        default_nodes = list(args.defaults)
        names = [a.arg for a in args.posonlyargs + args.args][-len(default_nodes):] if default_nodes else []
        own = self.ctx.defaults if self.enclosing is None else None
        if own is not None and len(own) == len(names):
            defaults.update(zip(names, own))  # the objects Python made at `def` time (`dict()`, a call)
        else:
            for name, default in zip(names, default_nodes):
                defaults[name] = self.static_default(default)
        own_kw = self.ctx.kwdefaults if self.enclosing is None else None
        for arg, default in zip(args.kwonlyargs, args.kw_defaults):
            if default is not None:
                if own_kw is not None and arg.arg in own_kw:
                    defaults[arg.arg] = own_kw[arg.arg]
                else:
                    defaults[arg.arg] = self.static_default(default)
        for stmt in node.body:
            self.visit(stmt)
        if not self.current or not isinstance(self.current[-1], ReturnInstruction):
            self.emit(ReturnInstruction(out_vars=[]), node.body[-1] if node.body else node)
        return FunctionSchema(
            name=node.name, params=positional, vararg=args.vararg.arg if args.vararg else None,
            kwonly=[a.arg for a in args.kwonlyargs], kwarg=args.kwarg.arg if args.kwarg else None,
            defaults=defaults, body=self.current, filename=self.src.filename,
            # the line of `source`'s first line (a decorator's when decorated, as `co_firstlineno`),
            # so line `firstlineno + i` of the file is line i of `source`
            firstlineno=self.src.firstlineno, source="\n".join(self.src.lines), free_vars=tuple(sorted(self.free_vars)),
            nonlocal_vars=tuple(sorted(self.nonlocals)), weight_refs=dict(self.weight_refs),
            self_name=self.self_name,
        )

    def static_default(self, node: ast.expr) -> Any:
        """A default value of the signature, evaluated as Python does: once, at definition time."""
        fn = getattr(self.ctx.module, "__class__", None)
        if isinstance(node, ast.Constant):
            return node.value
        try:
            return ast.literal_eval(node)
        except ValueError:
            pass
        found, value = self.static_value(node)
        if found:
            return value
        raise self.refuse(node, f"cannot evaluate the default value {ast.unparse(node)!r} statically")

    # -- statements -------------------------------------------------------------------------

    def visit(self, node: ast.stmt) -> None:
        getattr(self, "visit_" + type(node).__name__, self.generic_visit)(node)

    def generic_visit(self, node: ast.AST) -> None:
        raise self.refuse(node, f"the '{type(node).__name__}' statement is not supported by the lowering")

    def visit_Pass(self, node: ast.Pass) -> None:
        pass

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant):  # docstrings and bare literals
            return
        self.expr_into(node.value, self.new_temp())

    def visit_Assign(self, node: ast.Assign) -> None:
        first = node.targets[0]
        if isinstance(first, ast.Name) and len(node.targets) == 1:
            self.expr_into(node.value, first.id)
            self.note_module_var(first.id, None)
            return
        value = self.expr_operand(node.value)
        for target in node.targets:
            self.assign_target(target, value, node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is None:
            return
        if isinstance(node.target, ast.Name):
            self.expr_into(node.value, node.target.id)
        else:
            self.assign_target(node.target, self.expr_operand(node.value), node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        fn = self.INPLACE_OPS[type(node.op)]
        target = node.target
        if isinstance(target, ast.Name):
            current, value = self.in_order([target, node.value], lambda part: self.name_operand(target.id, target)
                                           if part is target else self.expr_operand(part))
            self.emit(op_instruction(target.id, fn, [current, value], style="binary",
                                     display=self.OP_SYMBOLS[type(node.op)] + "=", mutates=True), node)
            return
        if isinstance(target, ast.Subscript):
            obj = self.expr_operand(target.value)
            index = self.subscript_index(target.slice)
            temp = self.new_temp()
            self.emit(op_instruction(temp, operator.getitem, [obj, index], style="subscript"), node)
            value = self.expr_operand(node.value)
            result = self.new_temp()
            self.emit(op_instruction(result, fn, [VarRef(temp), value], style="binary",
                                     display=self.OP_SYMBOLS[type(node.op)] + "=", mutates=True), node)
            self.emit(op_instruction(self.new_temp(), operator.setitem,
                                     [obj, index, VarRef(result)], style="store_subscript", mutates=True), node)
            return
        if isinstance(target, ast.Attribute):
            obj = self.expr_operand(target.value)
            temp = self.new_temp()
            self.emit(op_instruction(temp, getattr, [obj, target.attr], display="getattr"), node)
            value = self.expr_operand(node.value)
            result = self.new_temp()
            self.emit(op_instruction(result, fn, [VarRef(temp), value], style="binary",
                                     display=self.OP_SYMBOLS[type(node.op)] + "=", mutates=True), node)
            self.emit(op_instruction(self.new_temp(), setattr, [obj, target.attr, VarRef(result)],
                                     display="setattr", mutates=True), node)
            return
        raise self.refuse(node, f"augmented assignment to {type(target).__name__} is not supported")

    def assign_target(self, target: ast.expr, value: Any, node: ast.AST) -> None:
        """Bind operand `value` to an assignment target (name, tuple, attribute, subscript, starred)."""
        if isinstance(target, ast.Name):
            self.emit(op_instruction(target.id, intrinsics.assign, [value], style="value"), node)
            self.note_module_var(target.id, None)
        elif isinstance(target, (ast.Tuple, ast.List)):
            elts = target.elts
            starred = [i for i, e in enumerate(elts) if isinstance(e, ast.Starred)]
            temp = self.new_temp()
            if starred:
                before = starred[0]
                after = len(elts) - before - 1
                self.emit(op_instruction(temp, intrinsics.unpack_starred, [value, before, after]), node)
            else:
                self.emit(op_instruction(temp, intrinsics.unpack, [value, len(elts)]), node)
            for index, elt in enumerate(elts):
                if isinstance(elt, ast.Starred):
                    elt = elt.value
                if isinstance(elt, ast.Name):
                    self.emit(op_instruction(elt.id, operator.getitem, [VarRef(temp), index], style="subscript"), node)
                    self.note_module_var(elt.id, None)
                else:
                    item = self.new_temp()
                    self.emit(op_instruction(item, operator.getitem, [VarRef(temp), index], style="subscript"), node)
                    self.assign_target(elt, VarRef(item), node)
        elif isinstance(target, ast.Attribute):
            obj = self.expr_operand(target.value)
            self.emit(op_instruction(self.new_temp(), setattr, [obj, target.attr, value], display="setattr",
                                     mutates=True), node)
        elif isinstance(target, ast.Subscript):
            obj = self.expr_operand(target.value)
            index = self.subscript_index(target.slice)
            self.emit(op_instruction(self.new_temp(), operator.setitem, [obj, index, value],
                                     style="store_subscript", mutates=True), node)
        else:
            raise self.refuse(node, f"assignment to {type(target).__name__} is not supported")

    def note_module_var(self, name: str, container: Optional[str], index_var: Optional[str] = None) -> None:
        if container is None:
            self.module_vars.pop(name, None)
            self.module_index_vars.pop(name, None)
        else:
            self.module_vars[name] = container
            self.module_index_vars[name] = index_var

    def visit_If(self, node: ast.If) -> None:
        condition, cond_var = self.condition(node.test)
        body = self.nested(node.body)
        else_body = self.nested(node.orelse)
        self.control("if", condition, cond_var, node, node.test, body=body, else_body=else_body)

    def condition(self, test: ast.expr) -> tuple[list[Instruction], str]:
        """Lower a test expression into its own instruction list; returns (instructions, variable).

        The list is split into a ControlInstruction's `prepare` and `condition` when it is emitted
        (ExpressionLowering.control)."""
        saved = self.current
        self.current = []
        try:
            operand = self.expr_operand(test)
            if isinstance(operand, VarRef):
                return self.current, operand.name
            temp = self.new_temp()
            self.emit(op_instruction(temp, intrinsics.assign, [operand], style="value"), test)
            return self.current, temp
        finally:
            self.current = saved

    def visit_For(self, node: ast.For) -> None:
        iter_instrs, iter_var = self.condition(node.iter)
        container = self.module_container(node.iter)
        if isinstance(node.target, ast.Name):
            bind_var = node.target.id
            prologue: list[Instruction] = []
        else:
            bind_var = self.new_temp()
            saved = self.current
            self.current = []
            self.assign_target(node.target, VarRef(bind_var), node)
            prologue, self.current = self.current, saved
        # Iterating module container entries (container_loops.py): the loop keeps the position in
        # `index_var`, and the calls of a loop variable holding an entry name the variable holding its
        # index or key in their BlockRef (the container entry they dispatch to).
        loop = self.container_loop(node, iter_instrs, iter_var)
        if loop is not None:
            iter_instrs = iter_instrs + loop.keys
            prologue = prologue + loop.prologue
            container, index_var = loop.iter_container, loop.index_var
            for name, path, key in loop.entries:
                self.note_module_var(name, path, key)
        else:
            # another child iterated as itself (an nn.ModuleDict's keys, a module with its own
            # __iter__): the loop keeps the position, but what it yields is not known to be the entry
            # at that index, so calls of the loop variable stay calls of a value
            index_var = f"${bind_var}_index" if container is not None and isinstance(node.target, ast.Name) else None
        self.loop_depth += 1
        try:
            body = prologue + self.nested(node.body)
        finally:
            self.loop_depth -= 1
        for name, _, _ in loop.entries if loop is not None else ():
            self.note_module_var(name, None)
        if isinstance(node.target, ast.Name):
            self.note_module_var(bind_var, None)
        else_body = self.nested(node.orelse)
        self.control("for", iter_instrs, iter_var, node, node.iter, body=body, else_body=else_body,
                     bind_var=bind_var, iter_container=container, index_var=index_var)

    def module_container(self, node: ast.expr) -> Optional[str]:
        """The attribute path when `node` is `self.<container>` holding modules (for display)."""
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == self.self_name and self.ctx.module is not None):
            value = getattr(self.ctx.module, "_modules", {}).get(node.attr)
            if value is not None:
                return node.attr
        return None

    def visit_While(self, node: ast.While) -> None:
        condition, cond_var = self.condition(node.test)
        self.loop_depth += 1
        try:
            body = self.nested(node.body)
        finally:
            self.loop_depth -= 1
        else_body = self.nested(node.orelse)
        self.control("while", condition, cond_var, node, node.test, body=body, else_body=else_body)

    def visit_Break(self, node: ast.Break) -> None:
        self.emit(BreakInstruction(), node)

    def visit_Continue(self, node: ast.Continue) -> None:
        self.emit(ContinueInstruction(), node)

    def visit_Return(self, node: ast.Return) -> None:
        value = node.value
        if value is None or (isinstance(value, ast.Constant) and value.value is None):
            self.emit(ReturnInstruction(out_vars=[]), node)
            return
        if isinstance(value, ast.Tuple) and not any(isinstance(e, ast.Starred) for e in value.elts):
            names = [self.operand_var(operand, e) for operand, e in zip(self.in_order(value.elts), value.elts)]
            self.emit(ReturnInstruction(out_vars=names, as_tuple=True), node)
            return
        self.emit(ReturnInstruction(out_vars=[self.operand_var(self.expr_operand(value), value)]), node)

    def operand_var(self, operand: Any, node: ast.AST) -> str:
        """A variable name holding `operand` (emits an assignment for literals and displays)."""
        if isinstance(operand, VarRef):
            return operand.name
        temp = self.new_temp()
        self.emit(op_instruction(temp, intrinsics.assign, [operand], style="value"), node)
        return temp

    def visit_Raise(self, node: ast.Raise) -> None:
        exc = self.expr_operand(node.exc) if node.exc is not None else None
        cause = self.expr_operand(node.cause) if node.cause is not None else None
        self.emit(RaiseInstruction(exc=exc, cause=cause, has_cause=node.cause is not None), node)

    def visit_Assert(self, node: ast.Assert) -> None:
        condition, cond_var = self.condition(node.test)
        saved = self.current
        self.current = []
        if node.msg is not None:
            message = self.expr_operand(node.msg)
            temp = self.new_temp()
            self.emit(op_instruction(temp, AssertionError, [message], display="AssertionError"), node)
            self.emit(RaiseInstruction(exc=VarRef(temp)), node)
        else:
            self.emit(RaiseInstruction(exc=Const(AssertionError, "AssertionError")), node)
        failing, self.current = self.current, saved
        self.control("if", condition, cond_var, node, node.test, body=[], else_body=failing)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            if isinstance(target, ast.Name):
                self.emit(DeleteInstruction(names=[target.id]), node)
            elif isinstance(target, ast.Subscript):
                obj = self.expr_operand(target.value)
                index = self.subscript_index(target.slice)
                self.emit(op_instruction(self.new_temp(), operator.delitem, [obj, index], mutates=True), node)
            elif isinstance(target, ast.Attribute):
                obj = self.expr_operand(target.value)
                self.emit(op_instruction(self.new_temp(), delattr, [obj, target.attr], mutates=True), node)
            elif isinstance(target, (ast.Tuple, ast.List)):
                self.visit_Delete(ast.Delete(targets=target.elts, lineno=node.lineno))
            else:
                raise self.refuse(node, f"del of {type(target).__name__} is not supported")

    def visit_With(self, node: ast.With) -> None:
        self.lower_with_items(node.items, node.body, node)

    def lower_with_items(self, items: list[ast.withitem], body: list[ast.stmt], node: ast.AST) -> None:
        item = items[0]
        context = self.operand_var(self.expr_operand(item.context_expr), item.context_expr)
        bind_var = None
        prologue: list[Instruction] = []
        if item.optional_vars is not None:
            if isinstance(item.optional_vars, ast.Name):
                bind_var = item.optional_vars.id
            else:
                bind_var = self.new_temp()
                saved = self.current
                self.current = []
                self.assign_target(item.optional_vars, VarRef(bind_var), node)
                prologue, self.current = self.current, saved
        saved = self.current
        self.current = list(prologue)
        try:
            if len(items) > 1:
                self.lower_with_items(items[1:], body, node)
            else:
                for stmt in body:
                    self.visit(stmt)
            inner = self.current
        finally:
            self.current = saved
        self.emit(WithInstruction(context_var=context, bind_var=bind_var, body=inner), node)

    def visit_Try(self, node: ast.Try) -> None:
        body = self.nested(node.body)
        handlers, names, bodies = [], [], []
        for handler in node.handlers:
            handlers.append(self.exception_classes(handler.type))
            names.append(handler.name)
            bodies.append(self.nested(handler.body))
        self.emit(TryInstruction(body=body, handlers=handlers, handler_names=names, handler_bodies=bodies,
                                 else_body=self.nested(node.orelse), final_body=self.nested(node.finalbody)), node)

    def exception_classes(self, node: Optional[ast.expr]) -> tuple[type, ...]:
        if node is None:
            return ()
        elts = node.elts if isinstance(node, ast.Tuple) else [node]
        classes = []
        for elt in elts:
            found, value = self.static_value(elt)
            if not found or not (isinstance(value, type) and issubclass(value, BaseException)):
                raise self.refuse(elt, f"the exception class {ast.unparse(elt)!r} must be resolvable statically")
            classes.append(value)
        return tuple(classes)
