"""Lowering: `for` loops over module containers, and which variable holds each entry's index or key.

A loop whose variable holds entries of an nn.ModuleList, nn.Sequential or nn.ModuleDict of the
module (or of the module itself, an nn.Sequential subclass iterating `self`) calls the entries as
sub-blocks: each call of the loop variable is a BlockInstruction whose `BlockRef(path, index_var)`
names the container and the scope variable holding the entry's index or key, and the loop's
ControlInstruction names the container in `iter_container` and the variable receiving the loop's
position (0, 1, 2, ...) in `index_var`. The forms:

    for layer in self.layers                   position is the index: `$layer_index`
    for i, layer in enumerate(self.layers)     the user's `i` (start 0); another start: `$layer_index`
    for layer in self.layers[1:] / [:n] / [::2], reversed(self.layers), reversed(self.layers[1:])
                                               the index in `self.layers` is `$layer_key`, read at the top
                                               of the body from the position in the indices the view
                                               visits (`entry_keys`, computed beside the iterable)
    for name, expert in self.experts.items()   the key is the user's `name`
    for expert in self.experts.values()        the key is `$expert_key`, read the same way
    for layer, norm in zip(self.layers, self.norms)
                                               each entry by its own container's index at the shared
                                               position; no single `iter_container` (None)

A user's variable names the index or key only when the loop body never rebinds it; otherwise the
hidden variable does. The calls still dispatch on the loop variable's value (`callee_var`), the
module the loop really iterates, so a child replaced at run time runs as it would in eager.

Depends on schema and intrinsics only (through the lowering it is mixed into).
"""

from __future__ import annotations

import ast
import builtins
import operator
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from torch import nn

from . import intrinsics
from .ops import op_instruction
from ..schema.model import Instruction, OpInstruction, SliceOf, VarRef

__all__ = ["ContainerLoop", "ContainerLoopLowering"]

_LISTS = (nn.ModuleList, nn.Sequential)
_PROTOCOL = ("__iter__", "__getitem__", "__len__", "__reversed__", "keys", "values", "items")


def _standard(child: Any, kinds: tuple) -> bool:
    """An instance of one of `kinds` iterating, indexing and listing its entries as that class does
    (a subclass overriding `__iter__` or `__getitem__` may visit its entries in another order)."""
    base = next((k for k in kinds if isinstance(child, k)), None)
    return base is not None and all(getattr(type(child), name, None) is getattr(base, name, None) for name in _PROTOCOL)


@dataclass
class _Source:
    """An iterable that yields entries of the container at `path`: the operand holding the
    container, and how the iteration's positions map to its indices or keys."""

    path: str
    container: Any
    index: Optional[SliceOf] = None  # a slice of the container
    reverse: bool = False  # reversed(...)
    keyed: bool = False  # an nn.ModuleDict's values() or items(): entries by key

    @property
    def direct(self) -> bool:
        """The position in the loop is the entry's index (`for layer in self.layers`)."""
        return self.index is None and not self.reverse and not self.keyed


@dataclass
class ContainerLoop:
    """What a loop over container entries adds to its ControlInstruction and its body."""

    iter_container: Optional[str]
    index_var: str
    entries: list[tuple[str, str, str]] = field(default_factory=list)  # (loop variable, path, index/key var)
    keys: list[Instruction] = field(default_factory=list)  # appended to the iterable's instructions (prepare)
    prologue: list[Instruction] = field(default_factory=list)  # the body's first instructions


def _bound_names(stmts: list[ast.stmt]) -> set[str]:
    """Every name the statements may bind or delete, nested scopes included (conservative)."""
    names: set[str] = set()
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                names.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                names.add(node.name)
            elif isinstance(node, ast.alias):
                names.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, (ast.Nonlocal, ast.Global)):
                names.update(node.names)
    return names


def _call_of(instr: Any, fn: Any, count: int) -> bool:
    """`instr` is a plain call of `fn` (no unpacked arguments) with `count` positional arguments."""
    return (isinstance(instr, OpInstruction) and instr.target is fn and len(instr.args) == count
            and not instr.star_args and instr.args_var is None and instr.kwargs_var is None)


class ContainerLoopLowering:
    """Mixin of FunctionLowering: recognises the loops over module containers (see the module doc)."""

    def container_loop(self, node: ast.For, iter_instrs: list[Instruction], iter_var: str) -> Optional[ContainerLoop]:
        """The container loop `node` is, given the lowered iterable (`iter_instrs` computing
        `iter_var`), or None when its variables hold no container entries."""
        if self.ctx.module is None:
            return None
        producers = {i.out_var: i for i in iter_instrs if isinstance(i, OpInstruction) and i.out_var}
        target, it = node.target, node.iter
        rebound = _bound_names(node.body)
        position: Optional[str] = None  # a user variable holding the position, else a hidden one
        given_key: Optional[str] = None  # a user variable holding the key (items())
        if isinstance(target, ast.Name):
            source = self.entry_source(it, iter_var, producers)
            if source is None:
                return None
            parts = [(target.id, source)]
            iter_container: Optional[str] = source.path
        else:
            names = self._target_names(target)
            call = producers.get(iter_var)
            if names is None or not isinstance(it, ast.Call) or call is None:
                return None
            if _call_of(call, builtins.enumerate, len(call.args)) and len(names) == 2 and names[1] is not None:
                start = call.args[1] if len(call.args) == 2 else call.kwargs.get("start", 0)
                if len(call.args) not in (1, 2) or set(call.kwargs) - {"start"} or len(it.args) != len(call.args):
                    return None
                source = self.entry_source(it.args[0], self._var(call.args[0]), producers)
                if source is None:
                    return None
                if type(start) is int and start == 0 and names[0] is not None and names[0] not in rebound:
                    position = names[0]
                parts, iter_container = [(names[1], source)], source.path
            elif isinstance(it.func, ast.Attribute) and it.func.attr == "items" and len(names) == 2 \
                    and names[1] is not None:
                source = self.dict_view_source(it, iter_var, producers, "items")
                if source is None:
                    return None
                if names[0] is not None and names[0] not in rebound:
                    given_key = names[0]
                parts, iter_container = [(names[1], source)], source.path
            elif _call_of(call, builtins.zip, len(call.args)) and len(names) == len(call.args) == len(it.args) \
                    and set(call.kwargs) <= {"strict"}:
                parts = []
                for name, arg_node, arg in zip(names, it.args, call.args):
                    source = self.entry_source(arg_node, self._var(arg), producers) if name is not None else None
                    if source is not None:
                        parts.append((name, source))
                if not parts:
                    return None
                iter_container = None  # several containers, or one beside other iterables
            else:
                return None
        loop = ContainerLoop(iter_container=iter_container, index_var=position or f"${parts[0][0]}_index")
        for name, source in parts:
            if given_key is not None:
                key = given_key
            elif source.direct:
                key = loop.index_var
            else:
                keys = self.new_temp()
                args = [source.container] + ([source.index] if source.index is not None or source.reverse else [])
                loop.keys.append(self.placed(keys, intrinsics.entry_keys, args + [True] * source.reverse, it,
                                             display="entry_keys"))
                key = f"${name}_key"
                loop.prologue.append(self.placed(key, operator.getitem, [VarRef(keys), VarRef(loop.index_var)], it,
                                                 style="subscript"))
            loop.entries.append((name, source.path, key))
        return loop

    def placed(self, out: str, fn: Any, args: list, node: ast.AST, **options: Any) -> Instruction:
        """An op instruction located at `node`, not emitted (the caller places it)."""
        instr = op_instruction(out, fn, args, **options)
        instr.location = self.location(node)
        return instr

    @staticmethod
    def _var(operand: Any) -> Optional[str]:
        return operand.name if isinstance(operand, VarRef) else None

    @staticmethod
    def _target_names(target: ast.expr) -> Optional[list[Optional[str]]]:
        """The names of a flat tuple target (None for a nested or starred element)."""
        if not isinstance(target, (ast.Tuple, ast.List)):
            return None
        return [elt.id if isinstance(elt, ast.Name) else None for elt in target.elts]

    def entry_source(self, node: ast.expr, var: Optional[str], producers: dict) -> Optional[_Source]:
        """When the iterable `node` (its value in `var`) yields entries of a module container."""
        if var is None:
            return None
        path, child = self.self_module_attr(node)
        if path is not None:
            return _Source(path, VarRef(var)) if _standard(child, _LISTS) else None
        instr = producers.get(var)
        if instr is None:
            return None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
            path, child = self.self_module_attr(node.value)
            if (path is not None and _standard(child, _LISTS) and _call_of(instr, operator.getitem, 2)
                    and isinstance(instr.args[0], VarRef) and isinstance(instr.args[1], SliceOf)):
                return _Source(path, instr.args[0], index=instr.args[1])
            return None
        if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords \
                and _call_of(instr, builtins.reversed, 1) and not isinstance(node.args[0], ast.Starred):
            inner = self.entry_source(node.args[0], self._var(instr.args[0]), producers)
            if inner is not None and not inner.reverse and not inner.keyed:
                return replace(inner, reverse=True)
            return None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "values":
            return self.dict_view_source(node, var, producers, "values")
        return None

    def dict_view_source(self, node: ast.Call, var: str, producers: dict, method: str) -> Optional[_Source]:
        """`self.<ModuleDict>.values()` / `.items()`: its entries by key."""
        if node.args or node.keywords:
            return None
        path, child = self.self_module_attr(node.func.value)
        instr = producers.get(var)
        if path is None or not _standard(child, (nn.ModuleDict,)) or instr is None:
            return None
        if not isinstance(instr.target, VarRef) or instr.args or instr.kwargs or instr.star_args:
            return None
        fetch = producers.get(instr.target.name)  # `$m = getattr(<container>, "values")`
        if not (_call_of(fetch, getattr, 2) and fetch.args[1] == method and isinstance(fetch.args[0], VarRef)):
            return None
        return _Source(path, fetch.args[0], keyed=True)
