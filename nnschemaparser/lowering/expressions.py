"""Lowering of expressions: one `expr_<Node>` per CPython expression node, mixed into FunctionLowering.

An expression becomes an operand (a VarRef, a literal, a Const, or a list/tuple/dict/slice display of
operands) plus the instructions that compute it. Calls, operators and subscripts become
OpInstructions; calls of child modules and methods become BlockInstructions; `and`/`or` and
conditional expressions become ControlInstructions so Python's short-circuit order is kept.

Depends on schema, intrinsics, notation and errors.

Longer than 600 lines because it is one visitor class with one method per CPython expression node
kind (and the helpers those share); splitting the class across files would scatter its dispatch.
"""

from __future__ import annotations

import ast
import inspect
import operator
import sys
import types
from typing import Any, Optional

from torch import nn

from . import intrinsics
from ..schema.notation import operand_text
from .context import MethodRequest
from ..schema.model import (
    Binding,
    BlockInstruction,
    BlockRef,
    Const,
    ControlInstruction,
    Instruction,
    OpInstruction,
    ReturnInstruction,
    SliceOf,
    TEST_STYLE,
    VarRef,
    YieldInstruction,
)

__all__ = ["ExpressionLowering", "op_instruction", "qualified_name_of", "named_test", "split_condition"]

_PRIMITIVES = (int, float, complex, str, bytes, bool, type(None), type(Ellipsis))


def qualified_name_of(fn: Any) -> str:
    """An importable dotted name for a callable, best effort ("torch.nn.functional.linear")."""
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if name is None:
        return type(fn).__qualname__
    if module is None:
        self_obj = getattr(fn, "__self__", None)
        if isinstance(self_obj, types.ModuleType):
            module = self_obj.__name__
        elif self_obj is not None and getattr(self_obj, "__name__", None):
            module = getattr(self_obj, "__module__", None) or self_obj.__name__
    if module in ("torch._C._VariableFunctions", "torch._C._nn", "torch._C._fft", "torch._C._linalg"):
        module = {"torch._C._VariableFunctions": "torch", "torch._C._nn": "torch._C._nn"}.get(module, module)
    return f"{module}.{name}" if module else name


def op_instruction(out_var: str, target: Any, args: list, kwargs: Optional[dict] = None, *, style: str = "call",
                   display: str = "", qualified: str = "", star_args: tuple = (), args_var: Optional[str] = None,
                   kwargs_var: Optional[str] = None, mutates: bool = False) -> OpInstruction:
    if not qualified:
        qualified = operand_text(target) if isinstance(target, VarRef) else qualified_name_of(target)
    return OpInstruction(out_var=out_var, target=target, qualified_name=qualified,
                         display_name=display or qualified, args=list(args), kwargs=dict(kwargs or {}),
                         star_args=tuple(star_args), args_var=args_var, kwargs_var=kwargs_var, style=style,
                         mutates=mutates)


def named_test(cond_var: str) -> OpInstruction:
    """The condition of a test whose value is already bound to `cond_var` when it is read (a plain
    name, or a value the last instruction of `prepare` binds without being an op of its own):
    `cond_var = assign(cond_var)` of style TEST_STYLE. It names the value for viewers and tooling;
    the runtime never runs it (schema.model.condition_instructions leaves it out)."""
    return op_instruction(cond_var, intrinsics.assign, [VarRef(cond_var)], style=TEST_STYLE, display="test")


def split_condition(instrs: list[Instruction], cond_var: str) -> tuple[list[Instruction], OpInstruction]:
    """(prepare, condition) of a test lowered into `instrs`, the value bound to `cond_var`: the last
    instruction is the condition when it is an OpInstruction binding `cond_var`, else a named test
    follows all of them. `prepare + [condition]` (without a named test) is `instrs`, in order."""
    last = instrs[-1] if instrs else None
    if isinstance(last, OpInstruction) and last.out_var == cond_var:
        return instrs[:-1], last
    return list(instrs), named_test(cond_var)


_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)


def _constant_key(node: ast.expr) -> Optional[int | str]:
    """The int (`0`, `-1`) or str (`"a"`) a subscript's index is written as, else None (bools are not indices)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        value = node.operand.value
        return -value if type(value) is int else None
    if isinstance(node, ast.Constant) and type(node.value) in (int, str):
        return node.value
    return None

class ExpressionLowering:
    """Mixin of FunctionLowering: everything about expressions."""

    BIN_OPS = {
        ast.Add: (operator.add, "+"), ast.Sub: (operator.sub, "-"), ast.Mult: (operator.mul, "*"),
        ast.MatMult: (operator.matmul, "@"), ast.Div: (operator.truediv, "/"),
        ast.FloorDiv: (operator.floordiv, "//"), ast.Mod: (operator.mod, "%"), ast.Pow: (operator.pow, "**"),
        ast.LShift: (operator.lshift, "<<"), ast.RShift: (operator.rshift, ">>"),
        ast.BitOr: (operator.or_, "|"), ast.BitXor: (operator.xor, "^"), ast.BitAnd: (operator.and_, "&"),
    }
    OP_SYMBOLS = {k: v[1] for k, v in BIN_OPS.items()}
    INPLACE_OPS = {
        ast.Add: operator.iadd, ast.Sub: operator.isub, ast.Mult: operator.imul, ast.MatMult: operator.imatmul,
        ast.Div: operator.itruediv, ast.FloorDiv: operator.ifloordiv, ast.Mod: operator.imod,
        ast.Pow: operator.ipow, ast.LShift: operator.ilshift, ast.RShift: operator.irshift,
        ast.BitOr: operator.ior, ast.BitXor: operator.ixor, ast.BitAnd: operator.iand,
    }
    UNARY_OPS = {ast.USub: (operator.neg, "-"), ast.UAdd: (operator.pos, "+"), ast.Invert: (operator.invert, "~"),
                 ast.Not: (operator.not_, "not")}
    COMPARE_OPS = {
        ast.Eq: (operator.eq, "=="), ast.NotEq: (operator.ne, "!="), ast.Lt: (operator.lt, "<"),
        ast.LtE: (operator.le, "<="), ast.Gt: (operator.gt, ">"), ast.GtE: (operator.ge, ">="),
        ast.Is: (operator.is_, "is"), ast.IsNot: (operator.is_not, "is not"),
        ast.In: (intrinsics.contains, "in"), ast.NotIn: (intrinsics.not_in, "not in"),
    }

    def nested_lowering(self, node: Any, *, enclosing: Any, is_method: bool,
                        local_names: Optional[set] = None) -> Any:
        """A lowering of the same kind for a nested scope (comprehension helper, lambda, def).

        Implemented by the statement lowering (`statements.FunctionLowering`), which mixes this
        class in; so expressions never import statements.
        """
        raise NotImplementedError

    # -- entry points -----------------------------------------------------------------------

    def expr_operand(self, node: ast.expr) -> Any:
        """Lower `node`; return the operand holding its value."""
        return self.expr(node, None)

    def expr_into(self, node: ast.expr, dest: str) -> None:
        """Lower `node` so that its value is bound to variable `dest`."""
        operand = self.expr(node, dest)
        if not (isinstance(operand, VarRef) and operand.name == dest):
            self.emit(op_instruction(dest, intrinsics.assign, [operand], style="value"), node)

    def expr(self, node: ast.expr, dest: Optional[str]) -> Any:
        method = getattr(self, "expr_" + type(node).__name__, None)
        if method is None:
            raise self.refuse(node, f"the '{type(node).__name__}' expression is not supported by the lowering")
        return method(node, dest)

    def target_var(self, dest: Optional[str]) -> str:
        return dest if dest is not None else self.new_temp()

    def in_order(self, nodes: list, lower: Any = None, initial: tuple = ()) -> list:
        """Lower sibling operands left to right, reading variables when CPython reads them.

        An operand that is a variable is read by the instruction that consumes it, after the
        later siblings ran. For a fragile name (one that may be unbound, or rebound by a walrus or
        a closure; see definite_assignment) the read is copied into a temporary first.
        """
        lower = lower or self.expr_operand
        operands: list = list(initial)  # operands lowered before (a callee), read first
        for node in nodes:
            start = len(self.current)
            operand = lower(node)
            if operands and len(self.current) > start:
                operands = self.pin_reads(operands, start, node)
            operands.append(operand)
        return operands

    def pin_reads(self, operands: list, start: int, node: ast.AST) -> list:
        """Copy the fragile variable reads inside `operands` at position `start` of the current list."""
        position = [start]

        def pin(op: Any) -> Any:
            if isinstance(op, VarRef):
                if op.name not in self.fragile:
                    return op
                temp = self.new_temp()
                copy = op_instruction(temp, intrinsics.assign, [op], style="value")
                copy.location = self.location(node)
                self.current.insert(position[0], copy)
                position[0] += 1
                return VarRef(temp)
            if isinstance(op, SliceOf):
                return SliceOf(pin(op.lower), pin(op.upper), pin(op.step))
            if isinstance(op, list):
                return [pin(item) for item in op]
            if isinstance(op, tuple):
                return tuple(pin(item) for item in op)
            if isinstance(op, dict):
                return {pin(key): pin(value) for key, value in op.items()}
            return op

        return [pin(op) for op in operands]

    # -- atoms ------------------------------------------------------------------------------

    def expr_Constant(self, node: ast.Constant, dest: Optional[str]) -> Any:
        return node.value

    def expr_Name(self, node: ast.Name, dest: Optional[str]) -> Any:
        return self.name_operand(node.id, node)

    def name_operand(self, name: str, node: ast.AST) -> Any:
        if self.is_local(name) or name in self.nonlocals:
            if name in self.nonlocals:
                self.free_vars.add(name)
            return VarRef(name)
        if self.lookup_enclosing(name):
            self.free_vars.add(name)
            return VarRef(name)
        found, value = self.ctx.resolve_global(name)
        if not found:
            temp = self.new_temp()
            self.emit(op_instruction(temp, intrinsics.raise_name_error, [name], display="NameError"), node)
            return VarRef(temp)
        return Const(value, name, binding=self.ctx.binding_of(name, value))

    def static_value(self, node: ast.expr) -> tuple[bool, Any]:
        """(True, value) when `node` names a global, builtin, or an attribute of a module or class."""
        if isinstance(node, ast.Name):
            if self.is_local(node.id) or self.lookup_enclosing(node.id):
                return False, None
            return self.ctx.resolve_global(node.id)
        if isinstance(node, ast.Attribute):
            found, base = self.static_value(node.value)
            if found and isinstance(base, (types.ModuleType, type)) and hasattr(base, node.attr):
                return True, getattr(base, node.attr)
        return False, None

    def static_binding(self, node: ast.expr, value: Any) -> Optional[Binding]:
        """The Binding of a name or a dotted chain rooted at a global or closure name (`F.gelu`)."""
        attrs = []
        root = node
        while isinstance(root, ast.Attribute):
            attrs.append(root.attr)
            root = root.value
        if not isinstance(root, ast.Name):
            return None
        found, base = self.ctx.resolve_global(root.id)
        if not found:
            return None
        binding = self.ctx.binding_of(root.id, base)
        if binding is None or not attrs:
            return binding
        return Binding(text=ast.unparse(node), kind=binding.kind, namespace=binding.namespace, key=binding.key,
                       attrs=tuple(reversed(attrs)), value=value)

    def is_self(self, node: ast.expr) -> bool:
        return isinstance(node, ast.Name) and self.self_name is not None and node.id == self.self_name

    def self_module_attr(self, node: ast.expr) -> tuple[Optional[str], Any]:
        """For `self.a.b` naming a registered sub-module: (path "a.b", module); else (None, None)."""
        names = []
        while isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        if not self.is_self(node) or self.ctx.module is None:
            return None, None
        module = self.ctx.module
        for name in reversed(names):
            children = getattr(module, "_modules", None)
            if not children or name not in children or children[name] is None:
                return None, None
            module = children[name]
        return ".".join(reversed(names)), module

    def expr_Attribute(self, node: ast.Attribute, dest: Optional[str]) -> Any:
        found, value = self.static_value(node)
        if found:
            return Const(value, ast.unparse(node), binding=self.static_binding(node, value))
        if self.is_self(node.value) and self.ctx.module is not None:
            module = self.ctx.module
            state = {**getattr(module, "_parameters", {}), **getattr(module, "_buffers", {})}
            if node.attr in state and not self.is_local(node.attr) and self.is_plain_attribute(node.attr):
                self.weight_refs[node.attr] = node.attr
                return VarRef(node.attr)
            if node.attr in state and self.is_plain_attribute(node.attr):
                ref = f"self.{node.attr}"
                self.weight_refs[ref] = node.attr
                return VarRef(ref)
        if self.is_self(node.value) and self.ctx.module is not None and isinstance(node.ctx, ast.Load):
            self.request_method_value(node.attr)
        base = self.expr_operand(node.value)
        out = self.target_var(dest)
        self.emit(op_instruction(out, getattr, [base, node.attr], display="getattr"), node)
        return VarRef(out)

    def request_method_value(self, attr: str) -> None:
        """`self.method` read as a value (not called here): ask for the method's schema, marked so
        that a run lends it to the instance and whoever calls the value runs the schema."""
        module = self.ctx.module
        if not isinstance(module, nn.Module) or attr in getattr(module, "__dict__", {}) or attr in ("forward", "__call__", "_call_impl"):
            return
        fn = inspect.getattr_static(module, attr, None)
        if not isinstance(fn, types.FunctionType):
            return
        owner = self._defining_class(type(module), attr)
        if self._framework_method(owner) or owner is None or owner.__module__.startswith("torch."):
            return
        self.ctx.requests.append(MethodRequest(path="", key=attr, function=fn, owner=owner, as_value=True))

    def is_plain_attribute(self, attr: str) -> bool:
        """False when the class defines `attr` itself (a property, e.g. a parametrization)."""
        return not hasattr(type(self.ctx.module), attr)

    # -- operators --------------------------------------------------------------------------

    def expr_BinOp(self, node: ast.BinOp, dest: Optional[str]) -> Any:
        fn, symbol = self.BIN_OPS[type(node.op)]
        left, right = self.in_order([node.left, node.right])
        out = self.target_var(dest)
        self.emit(op_instruction(out, fn, [left, right], style="binary", display=symbol), node)
        return VarRef(out)

    def expr_UnaryOp(self, node: ast.UnaryOp, dest: Optional[str]) -> Any:
        fn, symbol = self.UNARY_OPS[type(node.op)]
        value = self.expr_operand(node.operand)
        out = self.target_var(dest)
        self.emit(op_instruction(out, fn, [value], style="unary", display=symbol), node)
        return VarRef(out)

    def expr_Compare(self, node: ast.Compare, dest: Optional[str]) -> Any:
        out = self.target_var(dest)
        left, right = self.in_order([node.left, node.comparators[0]])
        if len(node.ops) == 1:
            fn, symbol = self.COMPARE_OPS[type(node.ops[0])]
            self.emit(op_instruction(out, fn, [left, right], style="binary", display=symbol), node)
            return VarRef(out)
        # a < b < c: each middle operand evaluated once, later comparisons only if earlier ones hold.
        self.compare_chain(node, left, list(zip(node.ops, node.comparators)), out, right)
        return VarRef(out)

    def compare_chain(self, node: ast.Compare, left: Any, rest: list, out: str, right: Any = None) -> None:
        op, comparator = rest[0]
        fn, symbol = self.COMPARE_OPS[type(op)]
        if right is None:
            right = self.expr_operand(comparator)
        # The middle operand is read once: a fragile variable is copied before the next operand runs.
        if len(rest) > 1 and not (isinstance(right, VarRef) and right.name not in self.fragile):
            right_var = self.new_temp()
            self.emit(op_instruction(right_var, intrinsics.assign, [right], style="value"), comparator)
            right = VarRef(right_var)
        self.emit(op_instruction(out, fn, [left, right], style="binary", display=symbol), node)
        if len(rest) > 1:
            saved = self.current
            self.current = []
            self.compare_chain(node, right, rest[1:], out)
            body, self.current = self.current, saved
            self.control("if", [], out, node, body=body, else_body=[])

    def control(self, kind: str, instrs: list[Instruction], cond_var: str, node: ast.AST,
                test: Optional[ast.AST] = None, **fields: Any) -> ControlInstruction:
        """Emit the ControlInstruction of `node`, its test lowered into `instrs` binding `cond_var`
        (split_condition); a named test is located at the `test` expression (else at `node`)."""
        prepare, condition = split_condition(instrs, cond_var)
        if condition.location is None:
            condition.location = self.location(test if test is not None else node)
        return self.emit(ControlInstruction(kind=kind, prepare=prepare, condition=condition, cond_var=cond_var,
                                            **fields), node)

    def expr_BoolOp(self, node: ast.BoolOp, dest: Optional[str]) -> Any:
        out = self.target_var(dest)
        self.bool_chain(node, node.values, isinstance(node.op, ast.And), out)
        return VarRef(out)

    def bool_chain(self, node: ast.BoolOp, values: list, is_and: bool, out: str) -> None:
        self.expr_into(values[0], out)
        if len(values) == 1:
            return
        saved = self.current
        self.current = []
        self.bool_chain(node, values[1:], is_and, out)
        rest, self.current = self.current, saved
        if is_and:
            self.control("if", [], out, node, body=rest, else_body=[])
        else:
            self.control("if", [], out, node, body=[], else_body=rest)

    def expr_IfExp(self, node: ast.IfExp, dest: Optional[str]) -> Any:
        out = self.target_var(dest)
        condition, cond_var = self.condition(node.test)
        saved = self.current
        self.current = []
        self.expr_into(node.body, out)
        body = self.current
        self.current = []
        self.expr_into(node.orelse, out)
        else_body, self.current = self.current, saved
        self.control("if", condition, cond_var, node, node.test, body=body, else_body=else_body)
        return VarRef(out)

    def expr_NamedExpr(self, node: ast.NamedExpr, dest: Optional[str]) -> Any:
        name = node.target.id
        scope = self
        if not self.is_local(name) and self.lookup_enclosing(name):
            self.free_vars.add(name)
            self.nonlocals.add(name)
        self.expr_into(node.value, name)
        if dest is not None and dest != name:
            self.emit(op_instruction(dest, intrinsics.assign, [VarRef(name)], style="value"), node)
            return VarRef(dest)
        return VarRef(name)

    # -- subscripts and displays ------------------------------------------------------------

    def subscript_index(self, node: ast.expr) -> Any:
        if isinstance(node, ast.Slice):
            parts = self.in_order([node.lower, node.upper, node.step],
                                  lambda p: None if p is None else self.expr_operand(p))
            return SliceOf(*parts)
        if isinstance(node, ast.Tuple) and not any(isinstance(e, ast.Starred) for e in node.elts):
            return tuple(self.in_order(node.elts, self.subscript_index))
        return self.expr_operand(node)

    def expr_Subscript(self, node: ast.Subscript, dest: Optional[str]) -> Any:
        value, index = self.in_order([node.value, node.slice],
                                     lambda part: self.subscript_index(part) if part is node.slice else
                                     self.expr_operand(part))
        out = self.target_var(dest)
        self.emit(op_instruction(out, operator.getitem, [value, index], style="subscript"), node)
        return VarRef(out)

    def expr_Slice(self, node: ast.Slice, dest: Optional[str]) -> Any:
        return self.subscript_index(node)

    def _display(self, node: Any, dest: Optional[str], kind: type, builder: Any) -> Any:
        if any(isinstance(e, ast.Starred) for e in node.elts):
            stars = [index for index, elt in enumerate(node.elts) if isinstance(elt, ast.Starred)]
            args = self.in_order(node.elts, lambda e: self.expr_operand(e.value if isinstance(e, ast.Starred) else e))
            out = self.target_var(dest)
            self.emit(op_instruction(out, builder, args, star_args=tuple(stars),
                                     display=builder.__name__), node)
            return VarRef(out)
        items = self.in_order(node.elts)
        if kind is set:
            out = self.target_var(dest)
            self.emit(op_instruction(out, intrinsics.build_set, items, display="set"), node)
            return VarRef(out)
        operand = tuple(items) if kind is tuple else list(items)
        if dest is not None:
            self.emit(op_instruction(dest, intrinsics.assign, [operand], style="value"), node)
            return VarRef(dest)
        return operand

    def expr_Tuple(self, node: ast.Tuple, dest: Optional[str]) -> Any:
        return self._display(node, dest, tuple, intrinsics.build_tuple)

    def expr_List(self, node: ast.List, dest: Optional[str]) -> Any:
        return self._display(node, dest, list, intrinsics.build_list)

    def expr_Set(self, node: ast.Set, dest: Optional[str]) -> Any:
        return self._display(node, dest, set, intrinsics.build_set)

    def expr_Dict(self, node: ast.Dict, dest: Optional[str]) -> Any:
        if any(k is None for k in node.keys):
            def lower_item(item: tuple) -> Any:
                key, value = item
                if key is not None:
                    return self.in_order([key, value])
                temp = self.new_temp()
                self.emit(op_instruction(temp, intrinsics.spread, [self.expr_operand(value)], display="spread"), node)
                return VarRef(temp)

            items = self.in_order(list(zip(node.keys, node.values)), lower_item)
            args = [tuple(item) if isinstance(item, list) else item for item in items]
            out = self.target_var(dest)
            self.emit(op_instruction(out, intrinsics.build_dict, args, display="dict"), node)
            return VarRef(out)
        flat = self.in_order([part for pair in zip(node.keys, node.values) for part in pair])
        pairs = list(zip(flat[0::2], flat[1::2]))
        if any(not isinstance(k, (VarRef, *_PRIMITIVES)) for k, _ in pairs) or len({
                k.name if isinstance(k, VarRef) else ("lit", k) for k, _ in pairs}) != len(pairs):
            out = self.target_var(dest)
            self.emit(op_instruction(out, intrinsics.build_dict, pairs, display="dict"), node)
            return VarRef(out)
        operand = {k: v for k, v in pairs}
        if dest is not None:
            self.emit(op_instruction(dest, intrinsics.assign, [operand], style="value"), node)
            return VarRef(dest)
        return operand

    def expr_JoinedStr(self, node: ast.JoinedStr, dest: Optional[str]) -> Any:
        def lower_piece(value: ast.expr) -> Any:
            if isinstance(value, ast.Constant):
                return value.value
            conversion = chr(value.conversion) if value.conversion != -1 else ""
            parts = [value.value] + ([value.format_spec] if value.format_spec is not None else [])
            operands = self.in_order(parts)
            return (operands[0], conversion, operands[1] if len(operands) > 1 else "")

        pieces = self.in_order(node.values, lower_piece)
        out = self.target_var(dest)
        self.emit(op_instruction(out, intrinsics.fstring, pieces, display="f-string"), node)
        return VarRef(out)

    def expr_FormattedValue(self, node: ast.FormattedValue, dest: Optional[str]) -> Any:
        return self.expr_JoinedStr(ast.JoinedStr(values=[node], lineno=node.lineno), dest)

    def expr_Starred(self, node: ast.Starred, dest: Optional[str]) -> Any:
        raise self.refuse(node, "a starred expression is only supported in calls, displays and assignment targets")

    # -- functions --------------------------------------------------------------------------

    def expr_Lambda(self, node: ast.Lambda, dest: Optional[str]) -> Any:
        out = self.target_var(dest)
        self.emit(self.function_instruction(node, out), node)
        return VarRef(out)

    def _comprehension(self, node: Any, dest: Optional[str], kind: str) -> Any:
        """A comprehension becomes a helper function over its first iterable, called at once."""
        generators = node.generators
        if any(g.is_async for g in generators):
            raise self.refuse(node, "async comprehensions are not supported")
        first_iter = self.expr_operand(generators[0].iter)
        helper = self.nested_lowering(node, enclosing=self, is_method=False,
                                      local_names=self._comprehension_locals(node))
        if self.self_name and self.self_name not in helper.locals:
            helper.self_name = self.self_name
        result = "$result"
        builder = {"list": [], "set": None, "dict": {}, "gen": []}[kind]
        if kind == "set":
            helper.emit(op_instruction(result, intrinsics.build_set, [], display="set"), node)
        else:
            helper.emit(op_instruction(result, intrinsics.assign, [builder], style="value"), node)
        helper.lower_generators(node, generators, 0, result, kind)
        if kind == "gen":
            temp = helper.new_temp()
            helper.emit(op_instruction(temp, iter, [VarRef(result)], display="iter"), node)
            helper.emit(ReturnInstruction(out_vars=[temp]), node)
        else:
            helper.emit(ReturnInstruction(out_vars=[result]), node)
        from ..schema.model import FunctionSchema, FunctionInstruction

        schema = FunctionSchema(name=f"<{kind}comp>", params=[".0"], body=helper.current,
                                filename=self.src.filename, firstlineno=node.lineno,
                                free_vars=tuple(sorted(helper.free_vars)),
                                nonlocal_vars=tuple(sorted(helper.nonlocals)), weight_refs=dict(helper.weight_refs))
        for name in helper.free_vars:
            if not self.is_local(name):
                self.free_vars.add(name)
        for name in helper.nonlocals:
            if not self.is_local(name):
                self.nonlocals.add(name)
        for name, attr in helper.weight_refs.items():
            self.weight_refs.setdefault(name, attr)
        fn_var = self.new_temp()
        self.emit(FunctionInstruction(out_var=fn_var, function=schema), node)
        out = self.target_var(dest)
        self.emit(op_instruction(out, VarRef(fn_var), [first_iter], display=f"<{kind}comp>"), node)
        return VarRef(out)

    def _comprehension_locals(self, node: Any) -> set:
        names = {".0", "$result"}
        for gen in node.generators:
            for sub in ast.walk(gen.target):
                if isinstance(sub, ast.Name):
                    names.add(sub.id)
        return names

    def lower_generators(self, node: Any, generators: list, index: int, result: str, kind: str) -> None:
        """Emit the nested for/if of a comprehension, appending to `result` at the innermost level."""
        gen = generators[index]
        if index == 0:
            iter_instrs, iter_var = [], ".0"
        else:
            iter_instrs, iter_var = self.condition(gen.iter)
        if isinstance(gen.target, ast.Name):
            bind_var, prologue = gen.target.id, []
        else:
            bind_var = self.new_temp()
            saved = self.current
            self.current = []
            self.assign_target(gen.target, VarRef(bind_var), node)
            prologue, self.current = self.current, saved
        saved = self.current
        self.current = list(prologue)
        self._lower_ifs(node, generators, index, gen.ifs, result, kind)
        body, self.current = self.current, saved
        self.control("for", iter_instrs, iter_var, node, gen.iter if index else None, body=body, else_body=[],
                     bind_var=bind_var)

    def _lower_ifs(self, node: Any, generators: list, index: int, ifs: list, result: str, kind: str) -> None:
        if ifs:
            condition, cond_var = self.condition(ifs[0])
            saved = self.current
            self.current = []
            self._lower_ifs(node, generators, index, ifs[1:], result, kind)
            body, self.current = self.current, saved
            self.control("if", condition, cond_var, node, ifs[0], body=body, else_body=[])
            return
        if index + 1 < len(generators):
            self.lower_generators(node, generators, index + 1, result, kind)
            return
        if kind == "dict":
            key = self.expr_operand(node.key)
            value = self.expr_operand(node.value)
            self.emit(op_instruction(self.new_temp(), operator.setitem, [VarRef(result), key, value],
                                     style="store_subscript"), node)
            return
        element = self.expr_operand(node.elt)
        method = "add" if kind == "set" else "append"
        fn = set.add if kind == "set" else list.append
        self.emit(op_instruction(self.new_temp(), fn, [VarRef(result), element], display=f"{result}.{method}",
                                 qualified=f"builtins.{'set' if kind == 'set' else 'list'}.{method}"), node)

    def expr_ListComp(self, node: ast.ListComp, dest: Optional[str]) -> Any:
        return self._comprehension(node, dest, "list")

    def expr_SetComp(self, node: ast.SetComp, dest: Optional[str]) -> Any:
        return self._comprehension(node, dest, "set")

    def expr_DictComp(self, node: ast.DictComp, dest: Optional[str]) -> Any:
        return self._comprehension(node, dest, "dict")

    def expr_Yield(self, node: ast.Yield, dest: Optional[str]) -> Any:
        """`yield v` in a generator function (a `@contextmanager` method): the value sent back is
        bound to a variable (a temporary when nothing reads it)."""
        value = None if node.value is None else self.expr_operand(node.value)
        out = self.target_var(dest)
        self.emit(YieldInstruction(out_var=out, value=value), node)
        return VarRef(out)

    def expr_GeneratorExp(self, node: ast.GeneratorExp, dest: Optional[str]) -> Any:
        return self._comprehension(node, dest, "gen")

    # -- calls ------------------------------------------------------------------------------

    def call_arguments(self, node: ast.Call, head: Optional[list] = None) -> tuple[list, dict, tuple, Optional[str]]:
        """The arguments in CPython's order (positional, then keywords); `head` (the callee) is read first."""
        head = head if head is not None else []
        def lower(entry: Any) -> Any:
            return self.expr_operand(entry.value if isinstance(entry, (ast.keyword, ast.Starred)) else entry)

        operands = self.in_order(list(node.args) + list(node.keywords), lower, initial=tuple(head))
        head[:] = operands[:len(head)]
        operands = operands[len(head):]
        args = operands[:len(node.args)]
        stars = [index for index, arg in enumerate(node.args) if isinstance(arg, ast.Starred)]
        kwargs: dict[str, Any] = {}
        spreads = []
        for keyword, operand in zip(node.keywords, operands[len(node.args):]):
            if keyword.arg is None:
                spreads.append(operand)
            else:
                kwargs[keyword.arg] = operand
        kwargs_var = None
        if spreads:
            kwargs_var = self.new_temp()
            self.emit(op_instruction(kwargs_var, intrinsics.merge_kwargs, spreads, display="merge_kwargs"), node)
        return args, kwargs, tuple(stars), kwargs_var

    def call_instruction(self, out: str, target: Any, args: list, kwargs: dict, *, display: str = "",
                         stars: tuple = (), kwargs_var: Optional[str] = None, mutates: bool = False) -> OpInstruction:
        if isinstance(target, Const):
            callee = target.value
            display = display or target.text
            mutates = mutates or self._mutating_callable(callee) or "inplace" in kwargs or "out" in kwargs
            instr = op_instruction(out, callee, args, kwargs, display=display, star_args=stars,
                                   kwargs_var=kwargs_var, mutates=mutates)
            instr.binding = target.binding
            return instr
        if not isinstance(target, VarRef):
            temp = self.new_temp()
            self.current.append(op_instruction(temp, intrinsics.assign, [target], style="value"))
            target = VarRef(temp)
        return op_instruction(out, target, args, kwargs, display=display or target.name, star_args=stars,
                              kwargs_var=kwargs_var, mutates=mutates or "inplace" in kwargs or "out" in kwargs)

    @staticmethod
    def _mutating_callable(fn: Any) -> bool:
        name = getattr(fn, "__name__", "") or ""
        return name.endswith("_") and not name.startswith("__")

    def in_nested_scope(self) -> bool:
        """True inside a closure, lambda or comprehension (one Python 3.12+ does not inline)."""
        if self.enclosing is None:
            return False
        inlined = sys.version_info >= (3, 12) and isinstance(self.node, (ast.ListComp, ast.SetComp, ast.DictComp))
        return not inlined or self.enclosing.in_nested_scope()

    def zero_argument_super(self, node: ast.Call, dest: Optional[str]) -> Any:
        """`super()` is `super(<class defining the method>, <its first argument>)`: only the method has both."""
        if self.in_nested_scope() or self.ctx.owner is None or self.self_name is None:
            raise self.refuse(node, "a zero-argument super() outside the method's own body cannot be lowered; "
                                    "write super(ClassName, self)")
        out = self.target_var(dest)
        owner = Const(self.ctx.owner, self.ctx.owner.__name__)
        self.emit(op_instruction(out, super, [owner, VarRef(self.self_name)], display="super"), node)
        return VarRef(out)

    def expr_Call(self, node: ast.Call, dest: Optional[str]) -> Any:
        func = node.func
        if isinstance(func, ast.Name) and func.id == "super" and not node.args and not node.keywords:
            found, value = self.static_value(func)
            if found and value is super:
                return self.zero_argument_super(node, dest)
        out = self.target_var(dest)
        block = self.block_call(node, func)
        if block is not None:
            block_ref, callee_var = block
            args, kwargs, stars, kwargs_var = self.call_arguments(node)
            self.emit(BlockInstruction(out_var=out, block_ref=block_ref, args=args, kwargs=kwargs,
                                       splat_args=self.is_chain(block_ref, callee_var), star_args=stars,
                                       kwargs_var=kwargs_var, callee_var=callee_var), node)
            return VarRef(out)
        if isinstance(func, ast.Attribute):
            found, _ = self.static_value(func)
            if not found and not self._is_weight_attr(func):
                # obj.method(...): fetch the bound method, then call it (the spec's two-step form).
                receiver = self.expr_operand(func.value)
                method_var = self.new_temp()
                self.emit(op_instruction(method_var, getattr, [receiver, func.attr], display="getattr"), node)
                args, kwargs, stars, kwargs_var = self.call_arguments(node)
                mutates = func.attr.endswith("_") and not func.attr.startswith("__")
                instr = self.call_instruction(out, VarRef(method_var), args, kwargs,
                                              display=f"{operand_text(receiver)}.{func.attr}", stars=stars,
                                              kwargs_var=kwargs_var, mutates=mutates)
                self.emit(instr, node)
                return VarRef(out)
        head = [self.expr_operand(func)]
        args, kwargs, stars, kwargs_var = self.call_arguments(node, head)
        callee = head[0]
        display = ast.unparse(func) if isinstance(func, (ast.Name, ast.Attribute)) else ""
        self.emit(self.call_instruction(out, callee, args, kwargs, display=display, stars=stars,
                                        kwargs_var=kwargs_var), node)
        return VarRef(out)

    def is_chain(self, block_ref: BlockRef, callee_var: Optional[str]) -> bool:
        """A call of a child nn.Sequential's forward: its argument is passed along the container's chain."""
        if callee_var is not None or block_ref.method is not None or not block_ref.path or self.ctx.module is None:
            return False
        try:
            child = self.ctx.module.get_submodule(block_ref.path)
        except AttributeError:
            return False
        return isinstance(child, nn.Sequential)

    def _is_weight_attr(self, func: ast.Attribute) -> bool:
        return False

    def block_call(self, node: ast.Call, func: ast.expr) -> Optional[tuple[BlockRef, Optional[str]]]:
        """(BlockRef, callee_var) when the call runs a child block or a method schema, else None."""
        module = self.ctx.module
        if module is not None and not isinstance(module, nn.Module):
            # a plain object's method (a processor's `__call__`): only module values dispatch to blocks
            if isinstance(func, ast.Name) and func.id in self.module_vars:
                return BlockRef(path=self.module_vars[func.id], index_var=self.module_index_vars.get(func.id)), func.id
            return None
        # self(...): the module's own forward, recursively.
        if self.is_self(func) and module is not None:
            return BlockRef(path=""), None
        # Loop variable over a module container: `for layer in self.layers: layer(x)`.
        if isinstance(func, ast.Name) and func.id in self.module_vars:
            return BlockRef(path=self.module_vars[func.id], index_var=self.module_index_vars.get(func.id)), func.id
        # self.container[key](...): dispatch into a ModuleList/Sequential/ModuleDict by the scope variable `key`.
        if isinstance(func, ast.Subscript) and isinstance(func.slice, ast.Name) and module is not None:
            path, child = self.self_module_attr(func.value)
            if isinstance(child, _CONTAINERS):
                callee = self.expr_operand(func)
                if isinstance(callee, VarRef):
                    return BlockRef(path=path, index_var=func.slice.id), callee.name
        # self.container[0](...), self.layers[-1](...), self.experts["a"](...): the constant is bound to a
        # scope variable first, which the BlockRef names, as for a variable index.
        if isinstance(func, ast.Subscript) and module is not None:
            found = self.constant_entry(func)
            if found is not None:
                return found
        if not isinstance(func, ast.Attribute) or module is None:
            return None
        # super().method(...) / super(Cls, self).method(...)
        if isinstance(func.value, ast.Call) and isinstance(func.value.func, ast.Name) and func.value.func.id == "super":
            return self.super_call(node, func)
        # self.child(...)
        path, child = self.self_module_attr(func)
        if child is not None:
            return BlockRef(path=path), None
        # self.child.forward(...) / self.child.some_method(...)
        path, child = self.self_module_attr(func.value)
        if child is not None:
            if func.attr == "forward":
                return BlockRef(path=path), None
            if not path and func.attr in getattr(child, "__dict__", {}):
                return self.object_call(func.attr)  # an instance attribute: a processor object, or no block
            fn = inspect.getattr_static(child, func.attr, None)
            # A container without a forward (ModuleList, ModuleDict) is no block: call its method live.
            has_block = getattr(type(child).forward, "__name__", "") != "_forward_unimplemented"
            if isinstance(fn, types.FunctionType) and has_block:
                owner = self._defining_class(type(child), func.attr)
                if self._framework_method(owner):
                    return None
                self.ctx.requests.append(_request(path, func.attr, fn, owner))
                return BlockRef(path=path, method=func.attr), None
            return None
        # self.method(...): a Python method of the module's class.
        if self.is_self(func.value):
            if func.attr == "forward":
                return BlockRef(path=""), None
            if func.attr in getattr(module, "__dict__", {}):
                return self.object_call(func.attr)  # an instance attribute shadows the method
            fn = inspect.getattr_static(module, func.attr, None)
            if isinstance(fn, types.FunctionType) and func.attr not in ("__call__", "_call_impl"):
                owner = self._defining_class(type(module), func.attr)
                if self._framework_method(owner):
                    return None
                self.ctx.requests.append(_request("", func.attr, fn, owner))
                return BlockRef(path="", method=func.attr), None
        return None

    def object_call(self, attr: str) -> Optional[tuple[BlockRef, Optional[str]]]:
        """`self.processor(...)` where the attribute holds a plain object with a Python `__call__`
        (a diffusers attention processor): a method schema of that `__call__`, whose `self` is the
        object the module holds at each call (see `MethodRequest.self_attr`)."""
        value = self.ctx.module.__dict__.get(attr)
        if value is None or isinstance(value, (nn.Module, type, types.FunctionType, types.MethodType)):
            return None
        call = inspect.getattr_static(type(value), "__call__", None)
        if not isinstance(call, types.FunctionType) or (call.__module__ or "").startswith(("torch.", "builtins")):
            return None
        key = f"{attr}.call"  # the method schema of calling the attribute (no dunder: files refuse those)
        self.ctx.requests.append(MethodRequest(path="", key=key, function=call, owner=type(value), self_attr=attr))
        return BlockRef(path="", method=key), None

    def constant_entry(self, func: ast.Subscript) -> Optional[tuple[BlockRef, str]]:
        """`self.c[K](...)` with K a constant naming an existing entry of the container `self.c` (or of
        `self`): lowered as `$i = K; $m = self.c[$i]`, returned as (BlockRef(c, index_var=$i), $m)."""
        key = _constant_key(func.slice)
        if key is None:
            return None
        path, child = self.self_module_attr(func.value)
        if not isinstance(child, _CONTAINERS):
            return None
        if isinstance(child, nn.ModuleDict):
            if not isinstance(key, str) or key not in child:
                return None
        elif not isinstance(key, int) or not -len(child) <= key < len(child):
            return None  # out of range: left to the plain subscript, which raises as Python does
        container = self.expr_operand(func.value)
        index_var = self.new_temp()
        self.emit(op_instruction(index_var, intrinsics.assign, [key], style="value"), func.slice)
        callee = self.new_temp()
        self.emit(op_instruction(callee, operator.getitem, [container, VarRef(index_var)], style="subscript"), func)
        return BlockRef(path=path, index_var=index_var), callee

    @staticmethod
    def _framework_method(owner: Optional[type]) -> bool:
        """Methods of nn.Module itself (modules(), parameters(), _apply...) are not model code."""
        return owner is None or owner.__module__ == "torch.nn.modules.module"

    @staticmethod
    def _defining_class(cls: type, attr: str) -> Optional[type]:
        for klass in cls.__mro__:
            if attr in klass.__dict__:
                return klass
        return None

    def super_call(self, node: ast.Call, func: ast.Attribute) -> Optional[tuple[BlockRef, Optional[str]]]:
        call = func.value
        module = self.ctx.module
        if call.args:
            if len(call.args) != 2 or not self.is_self(call.args[1]):
                return None
            found, start = self.static_value(call.args[0])
            if not found or not isinstance(start, type):
                return None
        else:
            start = self.ctx.owner
            if start is None or self.in_nested_scope():
                return None  # expr_Call refuses a zero-argument super() it cannot resolve
        mro = type(module).__mro__
        if start not in mro:
            return None
        for klass in mro[mro.index(start) + 1:]:
            if func.attr in klass.__dict__:
                fn = klass.__dict__[func.attr]
                if not isinstance(fn, types.FunctionType):
                    return None
                if getattr(fn, "__name__", "") == "_forward_unimplemented":
                    return None
                key = f"{klass.__qualname__}.{func.attr}"
                self.ctx.requests.append(_request("", key, fn, klass))
                return BlockRef(path="", method=key), None
        return None


def _request(path: str, key: str, fn: Any, owner: Optional[type]) -> MethodRequest:
    return MethodRequest(path=path, key=key, function=fn, owner=owner)
