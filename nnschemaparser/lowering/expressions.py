"""Lowering of expressions: one `expr_<Node>` per CPython expression node, mixed into FunctionLowering.

An expression becomes an operand (a VarRef, a literal, a Const, or a list/tuple/dict/slice display of
operands) plus the instructions that compute it. Operators and subscripts become OpInstructions;
`and`/`or` and conditional expressions become ControlInstructions so Python's short-circuit order is
kept. `ExpressionLowering` holds the dispatch (`expr`), names, attributes, operators, subscripts and
displays; calls are lowered by its `CallLowering` mixin (calls.py), comprehensions, generator
expressions, lambdas and `yield` by its `ComprehensionLowering` mixin (comprehensions.py).

Depends on schema, intrinsics, context, ops, calls and comprehensions.
"""

from __future__ import annotations

import ast
import inspect
import operator
import types
from typing import Any, Optional

from torch import nn

from . import intrinsics
from .calls import CallLowering
from .comprehensions import ComprehensionLowering
from .context import MethodRequest
from .ops import op_instruction, split_condition
from ..schema.model import Binding, Const, ControlInstruction, Instruction, SliceOf, VarRef

__all__ = ["ExpressionLowering"]

_PRIMITIVES = (int, float, complex, str, bytes, bool, type(None), type(Ellipsis))


class ExpressionLowering(CallLowering, ComprehensionLowering):
    """Mixin of FunctionLowering: everything about expressions (calls and comprehensions in their own mixins)."""

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
        if not found:  # a run reads the module's globals again: a global defined since is found, as in eager
            temp = self.new_temp()
            instr = op_instruction(temp, intrinsics.raise_name_error, [name], display="NameError")
            if self.ctx.globals is not None and name not in self.ctx.closure:
                instr.binding = Binding(text=name, kind="global", namespace=self.ctx.globals, key=name, missing=True)
            self.emit(instr, node)
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
