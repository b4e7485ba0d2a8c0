"""How generated code calls a child named by path (`self.fc1(x)`): `static_call` and its `StaticCall`.

The child is read from the module at each call, as `self.child(x)` does: forward may replace it
(`self.child = nn.Linear(...)`), and the new one then runs (its block, if it has one); while the
module holds the child the schema was parsed with, the call goes to that child's block invoker.

Depends on the schema, `binding` and `functions`.
"""

from __future__ import annotations

from typing import Any

from ..schema.model import BlockInstruction
from .binding import eager_callee
from .functions import name_reader

__all__ = ["StaticCall", "referenced_block", "static_call"]


class StaticCall:
    """What the code generator needs for a call of a child named by path (`self.fc1(x)`)."""

    __slots__ = ("invoke", "callee", "expected", "test", "simple_test", "first", "live")

    def __init__(self) -> None:
        self.invoke = self.callee = self.expected = self.test = self.live = None
        self.simple_test = False
        self.first = ""


def referenced_block(owner: Any, ref: Any) -> Any:
    """The block (or method block) a call's `block_ref` names under `owner`; None where the schema
    has none."""
    try:
        block = owner.find(ref.path)
    except KeyError:
        return None
    return block.methods.get(ref.method) if ref.method is not None else block


def static_call(instr: BlockInstruction, unit: Any) -> StaticCall:
    """How a call of the child at `instr.block_ref.path` runs: its block's invoker while the
    module holds the child the schema was parsed with, the live child otherwise (replaced since,
    or not in the schema)."""
    ref = instr.block_ref
    owner = unit.block
    block = referenced_block(owner, ref)
    path, method = ref.path, ref.method
    module = owner.module

    def live_target() -> Any:
        target = module
        for part in path.split(".") if path else ():
            target = target[int(part)] if part.lstrip("-").isdigit() else getattr(target, part)
        if method is not None:
            target = getattr(target, method)
        return target

    call = StaticCall()
    call.live = live_target
    if block is None:
        return call
    if block.read_from is not None:  # a cached function called by name: its block while the name holds it
        call.invoke, call.expected, call.callee = block, block.function, lambda f=block.function: f
        call.test, call.live = name_reader(block.read_from)
        return call
    expected, child_method = block.module, ref.method
    call.callee = lambda: eager_callee(expected, child_method)
    call.invoke = block
    parts = tuple(path.split(".")) if path else ()
    if not parts or expected is None or module is None:
        return call
    # The child is read from the module at each call, as `self.child(x)` does: forward may
    # replace it (`self.child = nn.Linear(...)`), and the new one runs (its block, if it has one).
    first, rest = parts[0], parts[1:]
    children = module._modules
    call.expected, call.first = expected, first
    if not rest:
        call.test, call.simple_test = children, True
    else:
        def current() -> Any:
            live = children.get(first)
            for part in rest:
                live = live._modules.get(part) if live is not None else None
            return live

        call.test = current
    return call
