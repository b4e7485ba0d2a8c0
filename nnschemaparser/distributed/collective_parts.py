"""The pieces of a collective run that need no process group: breakpoints, per-rank parts of an edit.

`CollectiveBreakpoint` (where or when a collective run stops), `local_part` (a rank's part of a
logical edit: a DTensor's own shard, a replicated value, or a `torch.chunk` piece), and the
fingerprints the ranks compare (of an instruction, of an edit's value). Used by `collective`.

Depends on the runtime's StepInfo and `stepping.checked_edits` (the shape of `edits=`, shared with
step_run), and the schema's errors only.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ..runtime.interpreter import CallPause, StepInfo
from ..runtime.stepping import checked_edits
from ..schema.errors import EditError

__all__ = ["CollectiveBreakpoint", "local_part", "is_dtensor", "placement_of", "step_fingerprint",
           "value_fingerprint", "planned_edits", "EDIT_KEYS"]

#: What one edit of a collective run takes (`run.edit`'s keywords, and an entry of `edits=`).
EDIT_KEYS = ("values", "out_var", "frame_depth", "placement", "shape", "dtype")


@dataclass
class CollectiveBreakpoint:
    """Where or when a collective run stops; a hit on any rank stops every rank.

    `kind`: "step" (`step`: that step index), "line" (`line`, optional `file`: the first step of the
    line), "block" (`block`: the first own step of each call of that block path), "var" (`var`, and
    `block` if given: each step binding that variable), "nonfinite" (a floating tensor with a NaN or
    an Inf), "when" (`when(step) -> bool`, evaluated on every rank; one that raises stops and says why).
    """

    kind: str
    step: int = 0
    line: int = 0
    file: str = ""
    block: str = ""
    var: str = ""
    when: Optional[Callable[[StepInfo], Any]] = None
    label: str = ""
    hits: int = 0

    def hit(self, step: StepInfo, previous: Optional[StepInfo], entry: bool) -> str:
        kind = self.kind
        if kind == "step":
            return f"reached step {self.step}" if step.step_index == self.step else ""
        if kind == "line":
            loc = step.location
            if loc is None or loc.lineno != self.line or (self.file and loc.filename != self.file):
                return ""
            ploc = previous.location if previous is not None else None
            same = ploc is not None and (ploc.lineno, ploc.filename) == (loc.lineno, loc.filename) and \
                previous.frame_depth == step.frame_depth
            return "" if same else f"reached line {self.line}"
        if kind == "block":
            return f"entered {self.block}" if entry and step.block_path == self.block else ""
        if kind == "var":
            if step.out_var != self.var or (self.block and step.block_path != self.block):
                return ""
            return f"bound {self.var}" + (f" in {step.block_path}" if step.block_path else "")
        if kind == "nonfinite":
            return f"{step.out_var or 'the value'} has a NaN or an Inf" if _nonfinite(step.value) else ""
        if kind == "when":
            try:
                result = self.when(step)
            except Exception as exc:  # noqa: BLE001 - a predicate that cannot be evaluated is news: stop and say so
                return f"the condition {self.label} raised {type(exc).__name__}: {exc}"
            if isinstance(result, torch.Tensor):
                result = bool(result.all()) if result.numel() else False
            return f"{self.label} is true" if result else ""
        return ""


def _nonfinite(value: Any) -> bool:
    if not isinstance(value, torch.Tensor) or not (value.is_floating_point() or value.is_complex()):
        return False
    if value.numel() == 0 or value.is_meta:
        return False
    local = value.to_local() if hasattr(value, "to_local") and hasattr(value, "placements") else value
    return not bool(torch.isfinite(local.detach()).all())


def is_dtensor(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and hasattr(value, "placements") and hasattr(value, "device_mesh")


def placement_of(placement: Any) -> Optional[tuple]:
    """None, ("replicate",) or ("shard", dim) from a torch placement, a string or a tuple."""
    if placement is None:
        return None
    name = type(placement).__name__
    if name == "Replicate":
        return ("replicate",)
    if name == "Shard" and isinstance(getattr(placement, "dim", None), int):
        return ("shard", placement.dim)
    if isinstance(placement, str):
        text = placement.strip().lower()
        if text == "replicate":
            return ("replicate",)
        if text.startswith("shard:") and text[6:].lstrip("-").isdigit():
            return ("shard", int(text[6:]))
    if isinstance(placement, (tuple, list)) and placement and placement[0] in ("replicate", "shard"):
        if placement[0] == "replicate" and len(placement) == 1:
            return ("replicate",)
        if len(placement) == 2 and type(placement[1]) is int:
            return ("shard", placement[1])
    raise EditError(f"placement={placement!r} is not one an edit knows; give Replicate(), Shard(dim) "
                    "(torch.distributed.tensor), 'replicate' or 'shard:<dim>'")


def local_part(values: torch.Tensor, current: Any, placement: Any, rank: int, world: int) -> torch.Tensor:
    """This rank's part of the logical `values` for a variable now holding `current` (see the module docstring)."""
    if not isinstance(values, torch.Tensor):
        raise EditError(f"an edit across ranks gives the whole tensor; got {type(values).__name__}")
    if is_dtensor(values):
        raise EditError("give the edit as a plain tensor holding the whole (logical) value, not a DTensor")
    place = placement_of(placement)
    if is_dtensor(current):
        if place is not None:
            raise EditError("the variable is a DTensor: its own placements say how the edit is sharded; "
                            "leave placement= out")
        if any(type(p).__name__ == "Partial" for p in current.placements):
            raise EditError("the variable is a partial sum (a Partial DTensor): it has no logical value "
                            "until it is reduced; edit the step after the reduction")
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(values.to(current.device), current.device_mesh, current.placements,
                                 src_data_rank=None)
    if place is None or place[0] == "replicate":
        return values
    dim = place[1]
    if not -values.dim() <= dim < max(values.dim(), 1):
        raise EditError(f"placement shard:{dim} names no dimension of the edit's {values.dim()}-d value")
    dim %= values.dim()
    size = values.shape[dim]
    piece = -(-size // world)  # torch.chunk's piece size, as DTensor's Shard uses
    start = min(rank * piece, size)
    return values.narrow(dim, start, max(0, min(piece, size - start))).clone()


def step_fingerprint(step: Optional[StepInfo | CallPause]) -> int:
    """The same number on every rank at the same instruction (or the same pause before a call)."""
    if step is None:
        return 0
    line = step.location.lineno if step.location is not None else 0
    if isinstance(step, CallPause):
        text = f"call|{step.callee_path}|{step.block_path}|{step.after_step}|{step.frame_depth}|{line}"
    else:
        text = f"{step.block_path}|{step.out_var}|{step.kind}|{step.frame_depth}|{line}"
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


def value_fingerprint(values: Any) -> int:
    if not isinstance(values, torch.Tensor):
        return 0
    flat = values.detach().cpu().contiguous().reshape(-1)
    data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return zlib.crc32(data + f"{tuple(values.shape)}{values.dtype}".encode()) & 0x7FFFFFFF


def planned_edits(edits: Any) -> dict[int, list[dict]]:
    """`edits=` of a collective run as {step index: [edit keywords, ...]}, in step order, or a
    SchemaRunError naming the first bad entry (`runtime.stepping.checked_edits`, with this run's
    keys). Each edit is `run.edit`'s: the whole (logical) value and how it is placed."""
    example = "e.g. {5: [{'values': whole_value, 'placement': 'shard:0'}]}"
    return dict(sorted(checked_edits(edits, EDIT_KEYS, example, _edit_problem).items()))


def _edit_problem(edit: dict) -> Optional[str]:
    """What is wrong with one planned edit's value or placement, or None."""
    values = edit.get("values")
    if not isinstance(values, torch.Tensor) or is_dtensor(values):
        return f"'values' must be the whole (logical) value as a plain tensor, got {type(values).__name__}"
    if edit.get("placement") is not None:
        try:
            placement_of(edit["placement"])
        except EditError as exc:
            return str(exc)
    return None
