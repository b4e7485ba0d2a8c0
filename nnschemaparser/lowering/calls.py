"""Lowering of calls, mixed into ExpressionLowering: `expr_Call` and where each call goes.

A call of a child module (`self.child(x)`, a loop variable over a module container, `self.layers[0]`,
`self.layers[i]`) or of a Python method of the module's class (`self.helper(x)`, `super().forward(x)`,
a plain object's `__call__`, a cached function called by its global name) becomes a BlockInstruction
naming the block, or the method schema it requests (a MethodRequest); a zero-argument `super()` becomes `super(Owner, self)`; any other call
becomes an OpInstruction, a method call in two steps (fetch the bound method, then call it). The
arguments are lowered in CPython's order.

Depends on schema, intrinsics, context and ops.
"""

from __future__ import annotations

import ast
import functools
import inspect
import operator
import sys
import types
from typing import Any, Optional

from torch import nn

from . import intrinsics
from ..schema.notation import operand_text
from .context import MethodRequest
from .ops import op_instruction
from ..schema.model import BlockInstruction, BlockRef, Const, OpInstruction, VarRef

__all__ = ["CallLowering"]

_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)


def _constant_key(node: ast.expr) -> Optional[int | str]:
    """The int (`0`, `-1`) or str (`"a"`) a subscript's index is written as, else None (bools are not indices)."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        value = node.operand.value
        return -value if type(value) is int else None
    if isinstance(node, ast.Constant) and type(node.value) in (int, str):
        return node.value
    return None


class CallLowering:
    """Mixin of ExpressionLowering: calls."""

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
        if isinstance(func, ast.Name) and module is not None:
            return self.cached_global(func)
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
            if (isinstance(fn, types.FunctionType) or _is_cache(fn)) and has_block:
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
            if (isinstance(fn, types.FunctionType) or _is_cache(fn)) and func.attr not in ("__call__", "_call_impl"):
                owner = self._defining_class(type(module), func.attr)
                if self._framework_method(owner):
                    return None
                self.ctx.requests.append(_request("", func.attr, fn, owner))
                return BlockRef(path="", method=func.attr), None
        return None

    def cached_global(self, func: ast.Name) -> Optional[tuple[BlockRef, Optional[str]]]:
        """`name(...)` where the global or closure `name` is a cached function (`functools.cache`, or a
        decorator holding a `functools.lru_cache` of the function it wraps): a schema of its body,
        which runs on each miss of the real cache while `name` holds that function."""
        found, value = self.static_value(func)
        if not found or not caching_function(value) or hasattr(type(self.ctx.module), func.id):
            return None
        binding = self.ctx.binding_of(func.id, value)
        if binding is None:
            return None
        self.ctx.requests.append(MethodRequest(path="", key=func.id, function=value, owner=None, binding=binding))
        return BlockRef(path="", method=func.id), None

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


def _is_cache(value: Any) -> bool:
    return isinstance(value, functools._lru_cache_wrapper) and isinstance(getattr(value, "__wrapped__", None),
                                                                          types.FunctionType)


def caching_function(value: Any) -> bool:
    """True for a `functools.lru_cache` of a Python function, or a decorator (diffusers'
    `lru_cache_unless_export`) closing over such a cache of the function it wraps."""
    if _is_cache(value):
        return True
    inner = getattr(value, "__wrapped__", None) if isinstance(value, types.FunctionType) else None
    if inner is None:
        return False
    for cell in value.__closure__ or ():
        try:
            contents = cell.cell_contents
        except ValueError:
            continue
        if _is_cache(contents) and contents.__wrapped__ is inner:
            return True
    return caching_function(inner)


def _request(path: str, key: str, fn: Any, owner: Optional[type]) -> MethodRequest:
    return MethodRequest(path=path, key=key, function=fn, owner=owner)
