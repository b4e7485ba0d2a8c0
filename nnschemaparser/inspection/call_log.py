"""What an instruction touched: the aten calls made while it ran, and the operands it names.

`CallLog` is a torch dispatch mode recording every aten call below autograd, as FlopCounterMode sees
them. It is a dispatch mode and not a torch function mode on purpose: torch code that checks
`has_torch_function` (the fused fast path of nn.TransformerEncoderLayer, for one) takes another path
under a function mode and computes different bits, while a dispatch mode changes nothing. Python
tensor objects keep their identity through it, so results can be matched with what the schema binds.

`instruction_operands` reads the values an Op/Block instruction names, in argument order, from the
frame it ran in; the name the instruction itself rebinds is reported as `UNKNOWN`.

Depends on torch and schema only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..schema.model import Const, SliceOf, VarRef

__all__ = ["Call", "Entered", "CallLog", "tensor_leaves", "written_tensors", "storage_key", "instruction_operands", "UNKNOWN"]

_MAX_LEAVES = 10_000
_MAX_DEPTH = 16


@dataclass
class Call:
    """One aten call: the overload, its arguments and what it returned."""

    func: Any
    args: tuple
    kwargs: dict
    result: Any


@dataclass(frozen=True)
class Entered:
    """A module was called eagerly (its `__call__` ran): a skipped child, or one called by an opaque op."""

    path: str


class CallLog(TorchDispatchMode):
    """Records every aten call made while it is active; `drain()` hands them over and starts afresh.

    `note(entry)` puts an `Entered` record in the same stream, so module calls keep their place
    among the aten calls.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Any] = []

    def note(self, entry: Entered) -> None:
        self.calls.append(entry)

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        self.calls.append(Call(func, args, kwargs, result))
        return result

    def drain(self) -> list[Any]:
        calls, self.calls = self.calls, []
        return calls


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    """The tensors inside `value` (tuples, lists, dicts and their subclasses), in order, bounded."""
    out: list[torch.Tensor] = []

    def walk(item: Any, depth: int) -> None:
        if len(out) >= _MAX_LEAVES or depth > _MAX_DEPTH:
            return
        if isinstance(item, torch.Tensor):
            out.append(item)
        elif isinstance(item, (tuple, list)):
            for sub in item:
                walk(sub, depth + 1)
        elif isinstance(item, dict):
            for sub in item.values():
                walk(sub, depth + 1)

    walk(value, 0)
    return out


def written_tensors(call: Call) -> list[torch.Tensor]:
    """The tensors an aten call writes into, from its schema (in-place ops, out= variants)."""
    schema = getattr(call.func, "_schema", None)
    if schema is None:
        return []
    written = []
    for position, argument in enumerate(schema.arguments):
        alias = argument.alias_info
        if alias is None or not alias.is_write:
            continue
        value = call.args[position] if position < len(call.args) else call.kwargs.get(argument.name)
        written.extend(tensor_leaves(value))
    return written


def storage_key(tensor: torch.Tensor) -> int:
    """The address of a tensor's storage (0 when it has none), shared by all views of it."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


UNKNOWN = object()  # an operand slot whose value the instruction itself has rebound


def _operand_values(operand: Any, frame: dict, rebound: str, out: list) -> None:
    """The values an operand reads, in order; `UNKNOWN` for the name the instruction rebinds."""
    if isinstance(operand, VarRef):
        out.append(UNKNOWN if operand.name == rebound else frame.get(operand.name))
    elif isinstance(operand, Const):
        out.append(operand.value)
    elif isinstance(operand, SliceOf):
        for part in (operand.lower, operand.upper, operand.step):
            _operand_values(part, frame, rebound, out)
    elif isinstance(operand, (list, tuple)):
        for item in operand:
            _operand_values(item, frame, rebound, out)
    elif isinstance(operand, dict):
        for item in operand.values():
            _operand_values(item, frame, rebound, out)


def instruction_operands(instr: Any, frame: dict) -> list:
    """What an Op/Block instruction reads, in argument order (the receiver of a bound method first)."""
    rebound = instr.out_var
    values: list = []
    target = getattr(instr, "target", None)
    if isinstance(target, VarRef):
        callee = UNKNOWN if target.name == rebound else frame.get(target.name)
        receiver = getattr(callee, "__self__", None)
        if isinstance(receiver, torch.Tensor):
            values.append(receiver)
    _operand_values(list(instr.args), frame, rebound, values)
    if instr.args_var:
        values.append(UNKNOWN if instr.args_var == rebound else frame.get(instr.args_var))
    _operand_values(dict(instr.kwargs), frame, rebound, values)
    if instr.kwargs_var:
        values.append(UNKNOWN if instr.kwargs_var == rebound else frame.get(instr.kwargs_var))
    return values
