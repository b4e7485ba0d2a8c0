"""Scope analysis of one function body: the names it binds, and its parameters.

`BindingCollector` walks a body without entering nested scopes and collects what it binds, its
`nonlocal` and `global` names and whether it yields; `arg_names` lists a signature's parameters.
FunctionLowering reads both to know its locals. Depends on the standard library only.
"""

from __future__ import annotations

import ast
from typing import Any

__all__ = ["BindingCollector", "arg_names"]


class BindingCollector(ast.NodeVisitor):
    """Collects the names a function body binds, without entering nested scopes."""

    def __init__(self) -> None:
        self.bound: set[str] = set()
        self.nonlocals: set[str] = set()
        self.globals: set[str] = set()
        self.yields = False
        self.delegates = False  # `yield from` / `await`

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self.bound.add(node.id)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.bound.add(node.name)
        for d in node.decorator_list:
            self.visit(d)
        for d in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
            self.visit(d)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.bound.add(node.name)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for d in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
            self.visit(d)

    def _comprehension(self, node: Any) -> None:
        # Only the first iterable is evaluated in the enclosing scope; walrus targets bind there too.
        self.visit(node.generators[0].iter)
        for sub in ast.walk(node):
            if isinstance(sub, ast.NamedExpr) and isinstance(sub.target, ast.Name):
                self.bound.add(sub.target.id)

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _comprehension

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.bound.add(node.name)
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.bound.add((alias.asname or alias.name).split(".")[0])

    visit_ImportFrom = visit_Import

    def visit_Nonlocal(self, node: ast.Nonlocal) -> None:
        self.nonlocals.update(node.names)

    def visit_Global(self, node: ast.Global) -> None:
        self.globals.update(node.names)

    def visit_Yield(self, node: ast.AST) -> None:
        self.yields = True
        self.generic_visit(node)

    def visit_YieldFrom(self, node: ast.AST) -> None:
        self.yields = self.delegates = True
        self.generic_visit(node)

    visit_Await = visit_YieldFrom


def arg_names(args: ast.arguments) -> list[str]:
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    if args.vararg:
        names.append(args.vararg.arg)
    if args.kwarg:
        names.append(args.kwarg.arg)
    return names
