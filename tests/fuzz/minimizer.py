"""Shrinks a failing program to a small one that fails the same way, statement by statement.

The generated bodies (Child.forward, Model.helper, Model.forward) are reduced by deleting one
statement, or replacing a compound statement (if/for/while/try/with) by one of its bodies, while the
oracle still gives the same verdict and category; the module scaffolding (constructors, `combine`,
`make_inputs`) is kept. The result is re-rendered with `ast.unparse`.

Depends on `oracle` and the standard library.
"""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import Callable, Iterator, Optional

from .oracle import Outcome, check_source

__all__ = ["minimize"]

_REDUCIBLE = {("Child", "forward"), ("Model", "helper"), ("Model", "forward")}


def _bodies(tree: ast.Module) -> Iterator[list]:
    """Every statement list inside the reducible methods (the method bodies first)."""
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and (cls.name, fn.name) in _REDUCIBLE:
                yield from _statement_lists(fn)


def _statement_lists(node: ast.AST) -> Iterator[list]:
    for name in ("body", "orelse", "finalbody"):
        stmts = getattr(node, name, None)
        if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
            yield stmts
            for stmt in stmts:
                yield from _statement_lists(stmt)
    for handler in getattr(node, "handlers", []) or []:
        yield from _statement_lists(handler)


def _candidates(tree: ast.Module) -> Iterator[ast.Module]:
    """Trees one reduction smaller than `tree`, the biggest reductions first."""
    count = sum(1 for _ in _bodies(tree))
    for index in range(count):
        stmts_len = len(list(_bodies(tree))[index])
        for position in range(stmts_len):
            yield from _at(tree, index, position)


def _at(tree: ast.Module, index: int, position: int) -> Iterator[ast.Module]:
    original = list(_bodies(tree))[index][position]
    replacements: list[list[ast.stmt]] = []
    for name in ("body", "orelse", "finalbody"):
        inner = getattr(original, name, None)
        if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
            replacements.append(inner)
    for handler in getattr(original, "handlers", []) or []:
        replacements.append(handler.body)
    is_last_return = isinstance(original, ast.Return)
    options = [] if is_last_return else [[]]
    options += replacements
    for option in options:
        candidate = copy.deepcopy(tree)
        stmts = list(_bodies(candidate))[index]
        stmts[position:position + 1] = copy.deepcopy(option) or ([ast.Pass()] if len(stmts) == 1 else [])
        yield ast.fix_missing_locations(candidate)


def minimize(source: str, directory: Path, *, budget: int = 400,
             same: Optional[Callable[[Outcome, Outcome], bool]] = None) -> tuple[str, Outcome]:
    """The smallest program found (within `budget` oracle runs) failing like `source`."""
    target = check_source(source, directory)
    if target.ok:
        return source, target
    same = same or (lambda a, b: a.verdict == b.verdict and a.category == b.category)
    tree = ast.parse(source)
    best, best_outcome = source, target
    runs = 0
    improved = True
    while improved and runs < budget:
        improved = False
        for candidate in _candidates(tree):
            if runs >= budget:
                break
            text = ast.unparse(candidate)
            runs += 1
            outcome = check_source(text, directory)
            if same(target, outcome):
                tree, best, best_outcome = candidate, text, outcome
                improved = True
                break
    return best, best_outcome
