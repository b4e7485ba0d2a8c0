"""Where the tensors of a value are, and what a mutating instruction may change: helpers of the recorder.

`tensors_in` walks nested tuples, lists and mappings (bounded by `CaptureLimits`); `mutated_tensors`
names the tensors an instruction flagged `mutates` may change; `_storage_ptr`, `_shape` and
`_version` read a tensor's storage, shape and version counter without failing on the tensors that
have none (sparse, meta, nested).

Depends on torch, schema and sampling.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator, Optional

import torch

from ..schema.model import Const, Instruction, OpInstruction, VarRef
from .sampling import CaptureLimits

__all__ = ["tensors_in", "mutated_tensors"]

_Tensor = torch.Tensor
_UNBOUNDED_DEPTH = 32


def tensors_in(value: Any, limits: Optional[CaptureLimits] = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(`[0]['key']`-style path, tensor) for each tensor in nested tuples, lists and mappings."""
    max_nodes = limits.max_traversal_nodes if limits is not None else None
    max_depth = limits.max_container_depth if limits is not None else _UNBOUNDED_DEPTH
    stack: list[tuple[str, Any, int]] = [("", value, 0)]
    visited = 0
    while stack:
        path, item, depth = stack.pop()
        visited += 1
        if max_nodes is not None and visited > max_nodes:
            return
        if isinstance(item, _Tensor):
            yield path, item
            continue
        if depth >= max_depth:
            continue
        if isinstance(item, (tuple, list)):
            children = [(f"{path}[{i}]", child) for i, child in enumerate(item)]
        elif isinstance(item, Mapping):
            children = [(f"{path}[{key!r}]", child) for key, child in item.items()]
        else:
            continue
        stack.extend((p, c, depth + 1) for p, c in reversed(children))


def _operand_value(operand: Any, frame: dict) -> Any:
    if isinstance(operand, VarRef):
        return frame.get(operand.name)
    if isinstance(operand, Const):
        return operand.value
    return operand


def mutated_tensors(instr: Instruction, frame: dict) -> list[torch.Tensor]:
    """The tensors a mutating instruction may change: its receiver or first argument, and `out=`."""
    if not isinstance(instr, OpInstruction):
        return []
    found: list[torch.Tensor] = []
    receiver = None
    if isinstance(instr.target, VarRef):
        receiver = getattr(frame.get(instr.target.name), "__self__", None)
    if isinstance(receiver, _Tensor):
        found.append(receiver)
    else:
        first: Any = None
        if instr.args:
            first = _operand_value(instr.args[0], frame)
            if 0 in instr.star_args and isinstance(first, (tuple, list)) and first:
                first = first[0]
        elif instr.args_var is not None:
            spread = frame.get(instr.args_var) or ()
            first = spread[0] if spread else None
        found.extend(t for _, t in tensors_in(first))
    if "out" in instr.kwargs:
        found.extend(t for _, t in tensors_in(_operand_value(instr.kwargs["out"], frame)))
    return found


def _storage_ptr(tensor: torch.Tensor) -> int:
    try:
        if tensor.__class__ is not _Tensor and tensor.__class__.__name__ == "FakeTensor":
            # estimate_capture's dry run: a fake storage has no data, but it is one object per storage
            return tensor.untyped_storage()._cdata
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return 0  # sparse, meta or otherwise storage-less: nothing to alias


def _shape(tensor: torch.Tensor) -> tuple:
    try:
        return tuple(tensor.shape)
    except (RuntimeError, TypeError):  # a nested tensor has no single shape
        return ()


def _version(tensor: torch.Tensor) -> int:
    try:
        return tensor._version
    except (RuntimeError, AttributeError):  # tensors without a version counter cannot change in place
        return -1
