"""Lowering of the statements that bind a function or a module, mixed into FunctionLowering.

A nested `def` (and a lambda, through `function_instruction`) becomes a FunctionInstruction binding a
closure, decorators applied after; `import` and `from ... import` bind the module or name as a
constant when it imports now, and import when the statement runs when it does not (as Python does);
`nonlocal` marks the names free.

Depends on schema, intrinsics and ops.
"""

from __future__ import annotations

import ast
from typing import Any

from . import intrinsics
from .ops import op_instruction
from ..schema.model import Const, FunctionInstruction, FunctionSchema, ReturnInstruction, VarRef

__all__ = ["DefinitionLowering"]


class DefinitionLowering:
    """Mixin of FunctionLowering: def, lambda bodies, nonlocal, import and from-import."""

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        fn_instr = self.function_instruction(node, node.name)
        self.emit(fn_instr, node)
        for decorator in reversed(node.decorator_list):
            deco = self.expr_operand(decorator)
            self.emit(self.call_instruction(node.name, deco, [VarRef(node.name)], {}, display=ast.unparse(decorator)),
                      node)

    def function_instruction(self, node: Any, out_var: str) -> FunctionInstruction:
        """Lower a nested def or lambda into a FunctionInstruction binding a closure to `out_var`."""
        args = node.args
        defaults = [self.expr_operand(d) for d in args.defaults]
        kw_defaults = {a.arg: self.expr_operand(d) for a, d in zip(args.kwonlyargs, args.kw_defaults)
                       if d is not None}
        inner = self.nested_lowering(node, enclosing=self, is_method=False)
        if self.self_name and self.self_name not in inner.locals:
            inner.self_name = self.self_name  # `self.child(...)` inside a closure still calls the child block
        if isinstance(node, ast.Lambda):
            value = inner.expr_operand(node.body)
            inner.emit(ReturnInstruction(out_vars=[inner.operand_var(value, node.body)]), node.body)
        else:
            for stmt in node.body:
                inner.visit(stmt)
            if not inner.current or not isinstance(inner.current[-1], ReturnInstruction):
                inner.emit(ReturnInstruction(out_vars=[]), node)
        positional = [a.arg for a in args.posonlyargs + args.args]
        schema = FunctionSchema(
            name=getattr(node, "name", "<lambda>"), params=positional,
            vararg=args.vararg.arg if args.vararg else None, kwonly=[a.arg for a in args.kwonlyargs],
            kwarg=args.kwarg.arg if args.kwarg else None, body=inner.current, filename=self.src.filename,
            firstlineno=node.lineno, free_vars=tuple(sorted(inner.free_vars)),
            nonlocal_vars=tuple(sorted(inner.nonlocals)), weight_refs=dict(inner.weight_refs),
        )
        # Names the closure reads (or rebinds) from this function's enclosing scopes are free here too.
        for name in inner.free_vars:
            if not self.is_local(name):
                self.free_vars.add(name)
        for name in inner.nonlocals:
            if not self.is_local(name):
                self.nonlocals.add(name)
        for name, attr in inner.weight_refs.items():
            self.weight_refs.setdefault(name, attr)
        return FunctionInstruction(out_var=out_var, function=schema, defaults=defaults, kw_defaults=kw_defaults)

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        for name in node.names:
            self.free_vars.add(name)

    def visit_Import(self, node: ast.Import) -> None:
        """`import a.b as c` binds the module. One importable now is bound as a constant (importing a
        loaded module again only looks it up); one that fails to import now is imported when the
        statement runs, as Python does: a branch that never runs (`if npu: import torch_npu`) costs
        nothing, and one that runs raises Python's own ImportError."""
        for alias in node.names:
            name = alias.asname or alias.name.split(".")[0]
            try:
                module = self.import_module(alias.name, 0)
                value = module if alias.asname else self.import_module(alias.name.split(".")[0], 0)
            except Exception:  # imported when the statement runs
                spec = intrinsics.DeferredImport(alias.name, self.import_package(), 0, "", alias.asname is not None)
                self.emit_deferred_import(name, spec, alias.name, node)
                continue
            self.emit(op_instruction(name, intrinsics.assign, [Const(value, alias.name)], style="value"), node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if any(alias.name == "*" for alias in node.names):
            raise self.refuse(node, "'from ... import *' inside forward is not supported")
        try:
            module = self.import_module(node.module or "", node.level)
            values = []
            for alias in node.names:
                if hasattr(module, alias.name):
                    values.append(getattr(module, alias.name))
                else:
                    values.append(self.import_module(f"{module.__name__}.{alias.name}", 0))
        except Exception:  # imported when the statement runs, as in visit_Import
            package = self.import_package()
            for alias in node.names:  # importing the module again for the next name is a lookup
                spec = intrinsics.DeferredImport(node.module or "", package, node.level, alias.name)
                spelled = "." * node.level + (f"{node.module}." if node.module else "") + alias.name
                self.emit_deferred_import(alias.asname or alias.name, spec, spelled, node)
            return
        for alias, value in zip(node.names, values):
            self.emit(op_instruction(alias.asname or alias.name, intrinsics.assign,
                                     [Const(value, f"{node.module or ''}.{alias.name}")], style="value"), node)

    def emit_deferred_import(self, name: str, spec: Any, spelled: str, node: ast.AST) -> None:
        # `nnschemaparser.intrinsics.` is the intrinsics' name in files (files/allowlist.py), not a module
        # path; saved schemas compare it, so it stays
        self.emit(op_instruction(name, intrinsics.run_import, [Const(spec, spelled)], display="import",
                                 qualified="nnschemaparser.intrinsics.run_import"), node)

    def import_package(self) -> str:
        """The package relative imports resolve against, computed as CPython's `_calc___package__`."""
        found = self.ctx.globals
        if found.get("__package__") is not None:
            return found["__package__"]
        spec = found.get("__spec__")
        if spec is not None:
            return spec.parent
        name = found.get("__name__", "") or ""
        return name if "__path__" in found else name.rpartition(".")[0]

    def import_module(self, name: str, level: int) -> Any:
        import importlib

        if level:
            return importlib.import_module("." * level + name, self.import_package())
        return importlib.import_module(name)
