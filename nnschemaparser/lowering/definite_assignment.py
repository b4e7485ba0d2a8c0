"""Definite assignment: which local names a function may read before they hold a value.

The lowering reads a variable when the instruction that consumes it runs, which can be after a
later operand of the same expression was computed. CPython reads it first. The two orders only
differ when the read can fail (an unbound local) or when the later operand rebinds the name, so
the lowering copies a read into a temporary first only for such "fragile" names, and the schema of
ordinary code keeps its plain shape.

`fragile_names(fn)` is conservative: a name it leaves out is bound at every read and never rebound
by a walrus or by a closure's `nonlocal`. The analysis follows Python's control flow on the `ast`
(branches meet, loops may run zero times, any point of a `try` body may jump to its handlers).

Depends on the standard library only.
"""

from __future__ import annotations

import ast
from typing import Optional

__all__ = ["fragile_names"]

_Bound = Optional[frozenset]  # None: the code does not fall through (return, raise, break, ...)


def fragile_names(fn: ast.AST) -> set[str]:
    """Names of `fn` that some read may find unbound, or that a walrus or a closure may rebind."""
    args = fn.args
    params = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    params |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
    flow = _Flow()
    body = fn.body if isinstance(fn.body, list) else [ast.Return(value=fn.body)]
    flow.block(body, frozenset(params))
    return flow.fragile


def _meet(a: _Bound, b: _Bound) -> _Bound:
    if a is None:
        return b
    if b is None:
        return a
    return a & b


def _target_names(target: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _deleted(stmts: list) -> set[str]:
    names: set[str] = set()
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Delete):
                for target in node.targets:
                    names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
            elif isinstance(node, ast.ExceptHandler) and node.name:
                names.add(node.name)  # unbound again when the handler ends
    return names


def _breaks(stmts: list) -> bool:
    """True when `stmts`, the body of a loop, can leave that loop with `break`."""
    for stmt in stmts:
        if isinstance(stmt, ast.Break):
            return True
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            if _breaks(stmt.orelse):  # a break in the inner loop's body leaves only the inner loop
                return True
            continue
        inner = [getattr(stmt, field, None) or [] for field in ("body", "orelse", "finalbody")]
        inner += [part.body for part in (getattr(stmt, "handlers", None) or []) + (getattr(stmt, "cases", None) or [])]
        if any(_breaks(part) for part in inner if isinstance(part, list)):
            return True
    return False


class _Flow:
    def __init__(self) -> None:
        self.fragile: set[str] = set()

    # -- statements ---------------------------------------------------------------------------

    def block(self, stmts: list, bound: _Bound) -> _Bound:
        for stmt in stmts:
            if bound is None:
                return None
            bound = self.stmt(stmt, bound)
        return bound

    def stmt(self, node: ast.stmt, bound: frozenset) -> _Bound:
        method = getattr(self, "stmt_" + type(node).__name__, None)
        if method is not None:
            return method(node, bound)
        for child in ast.iter_child_nodes(node):  # simple statements: their expressions, in order
            if isinstance(child, ast.expr):
                bound = self.expr(child, bound)
        return bound

    def stmt_Assign(self, node: ast.Assign, bound: frozenset) -> frozenset:
        bound = self.expr(node.value, bound)
        for target in node.targets:
            bound = self.store(target, bound)
        return bound

    def stmt_AnnAssign(self, node: ast.AnnAssign, bound: frozenset) -> frozenset:
        if node.value is None:
            return bound
        return self.store(node.target, self.expr(node.value, bound))

    def stmt_AugAssign(self, node: ast.AugAssign, bound: frozenset) -> frozenset:
        if isinstance(node.target, ast.Name):
            self.read(node.target.id, bound)
        else:
            bound = self.expr(node.target.value, bound)
        return self.store(node.target, self.expr(node.value, bound))

    def stmt_Delete(self, node: ast.Delete, bound: frozenset) -> frozenset:
        for target in node.targets:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    self.read(name.id, bound)
                    bound = bound - {name.id}
                elif isinstance(name, (ast.Subscript, ast.Attribute)):
                    bound = self.expr(name.value, bound)
        return bound

    def stmt_Return(self, node: ast.Return, bound: frozenset) -> _Bound:
        if node.value is not None:
            self.expr(node.value, bound)
        return None

    def stmt_Raise(self, node: ast.Raise, bound: frozenset) -> _Bound:
        for part in (node.exc, node.cause):
            if part is not None:
                bound = self.expr(part, bound)
        return None

    def stmt_Break(self, node: ast.AST, bound: frozenset) -> _Bound:
        return None

    stmt_Continue = stmt_Break

    def stmt_If(self, node: ast.If, bound: frozenset) -> _Bound:
        bound = self.expr(node.test, bound)
        return _meet(self.block(node.body, bound), self.block(node.orelse, bound))

    def _loop(self, node: ast.AST, entry: frozenset, body_entry: frozenset) -> _Bound:
        self.block(node.body, body_entry)
        after = self.block(node.orelse, entry)
        if after is None or _breaks(node.body):
            after = entry  # left by `break`: only what held before the loop
        return after

    def stmt_For(self, node: ast.For, bound: frozenset) -> _Bound:
        bound = self.expr(node.iter, bound)
        entry = bound - _deleted(node.body)
        return self._loop(node, entry, self.store(node.target, entry))

    stmt_AsyncFor = stmt_For

    def stmt_While(self, node: ast.While, bound: frozenset) -> _Bound:
        entry = bound - _deleted(node.body)
        entry = self.expr(node.test, entry)
        return self._loop(node, entry, entry)

    def stmt_Try(self, node: ast.Try, bound: frozenset) -> _Bound:
        body = self.block(node.body, bound)
        weak = bound - _deleted(node.body)
        outs = [self.block(node.orelse, body) if body is not None else None]
        for handler in node.handlers:
            entry = weak
            if handler.type is not None:
                entry = self.expr(handler.type, entry)
            if handler.name:
                entry = entry | {handler.name}
            out = self.block(handler.body, entry)
            outs.append(None if out is None else out - {handler.name} if handler.name else out)
        after: _Bound = None
        for out in outs:
            after = _meet(after, out)
        if node.finalbody:
            self.block(node.finalbody, weak - _deleted(node.handlers) - _deleted(node.orelse))
            after = None if after is None else self.block(node.finalbody, after)
        return after

    stmt_TryStar = stmt_Try

    def stmt_With(self, node: ast.With, bound: frozenset) -> _Bound:
        for item in node.items:
            bound = self.expr(item.context_expr, bound)
            if item.optional_vars is not None:
                bound = self.store(item.optional_vars, bound)
        return self.block(node.body, bound)

    stmt_AsyncWith = stmt_With

    def stmt_FunctionDef(self, node: ast.FunctionDef, bound: frozenset) -> frozenset:
        for expr in node.decorator_list + node.args.defaults + [d for d in node.args.kw_defaults if d]:
            bound = self.expr(expr, bound)
        # A closure that rebinds one of our names with `nonlocal` may run in any later expression.
        for inner in ast.walk(node):
            if isinstance(inner, ast.Nonlocal):
                self.fragile.update(inner.names)
        return bound | {node.name}

    stmt_AsyncFunctionDef = stmt_FunctionDef

    def stmt_ClassDef(self, node: ast.ClassDef, bound: frozenset) -> frozenset:
        for expr in node.decorator_list + node.bases + [k.value for k in node.keywords]:
            bound = self.expr(expr, bound)
        return bound | {node.name}

    def stmt_Import(self, node: ast.AST, bound: frozenset) -> frozenset:
        return bound | {(a.asname or a.name).split(".")[0] for a in node.names}

    stmt_ImportFrom = stmt_Import

    def stmt_Nonlocal(self, node: ast.AST, bound: frozenset) -> frozenset:
        self.fragile.update(node.names)  # a cell of the enclosing function: bound there, or not
        return bound

    def stmt_Match(self, node: ast.AST, bound: frozenset) -> _Bound:
        bound = self.expr(node.subject, bound)
        after: _Bound = None
        for case in node.cases:
            entry = bound | _target_names(case.pattern) | {
                n.name for n in ast.walk(case.pattern) if isinstance(getattr(n, "name", None), str)}
            if case.guard is not None:
                entry = self.expr(case.guard, entry)
            after = _meet(after, self.block(case.body, entry))
        return _meet(after, bound)  # no case may match

    # -- expressions, in evaluation order -----------------------------------------------------

    def read(self, name: str, bound: frozenset) -> None:
        if name not in bound:
            self.fragile.add(name)

    def store(self, target: ast.AST, bound: frozenset) -> frozenset:
        for node in ast.walk(target):
            if isinstance(node, (ast.Subscript, ast.Attribute)):
                bound = self.expr(node.value, bound)
                if isinstance(node, ast.Subscript):
                    bound = self.expr(node.slice, bound)
        return bound | _target_names(target)

    def expr(self, node: ast.expr, bound: frozenset) -> frozenset:
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                self.read(node.id, bound)
            return bound
        if isinstance(node, ast.NamedExpr):
            bound = self.expr(node.value, bound)
            self.fragile.add(node.target.id)  # a walrus may rebind a name an earlier operand read
            return bound | {node.target.id}
        if isinstance(node, ast.BoolOp):
            after = self.expr(node.values[0], bound)
            inner = after
            for value in node.values[1:]:
                inner = self.expr(value, inner)  # only when reached: bindings here are not definite
            return after
        if isinstance(node, ast.IfExp):
            bound = self.expr(node.test, bound)
            return self.expr(node.body, bound) & self.expr(node.orelse, bound)
        if isinstance(node, ast.Lambda):
            for default in node.args.defaults + [d for d in node.args.kw_defaults if d]:
                bound = self.expr(default, bound)
            return bound
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            return self.comprehension(node, bound)
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if key is not None:
                    bound = self.expr(key, bound)
                bound = self.expr(value, bound)
            return bound
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                bound = self.expr(child, bound)
            elif isinstance(child, ast.keyword):
                bound = self.expr(child.value, bound)
        return bound

    def comprehension(self, node: ast.AST, bound: frozenset) -> frozenset:
        generators = node.generators
        after = self.expr(generators[0].iter, bound)
        inner = after
        for index, generator in enumerate(generators):
            if index:
                inner = self.expr(generator.iter, inner)
            inner = inner | _target_names(generator.target)
            for condition in generator.ifs:
                inner = self.expr(condition, inner)
        parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        for part in parts:
            inner = self.expr(part, inner)
        return after  # a walrus inside binds only if an element is computed
