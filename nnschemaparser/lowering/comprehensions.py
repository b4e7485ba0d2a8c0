"""Lowering of the expressions that make a function, mixed into ExpressionLowering.

A list, set or dict comprehension or a generator expression becomes a helper FunctionSchema over its
first iterable (evaluated in the enclosing scope), called at once, as CPython compiles it; a lambda
becomes a FunctionInstruction (statements.FunctionLowering.function_instruction); `yield v` becomes
a YieldInstruction binding the value sent back.

Depends on schema, intrinsics and ops.
"""

from __future__ import annotations

import ast
import operator
from typing import Any, Optional

from . import intrinsics
from .ops import op_instruction
from ..schema.model import FunctionInstruction, FunctionSchema, ReturnInstruction, VarRef, YieldInstruction

__all__ = ["ComprehensionLowering"]


class ComprehensionLowering:
    """Mixin of ExpressionLowering: comprehensions, generator expressions, lambdas and yield."""

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
