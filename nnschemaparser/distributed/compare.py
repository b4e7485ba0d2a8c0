"""`compare_logical`: a sharded run's gathered values against a one-process run, per variable.

For every step of the logical trace: its placement, whether the gathered value is `torch.equal` to
the reference step with the same container id, the largest absolute difference, and a reason. A
value that went through a sum over shards (a partial sum, a row-parallel output, anything computed
from one) is not expected to be exact, since its additions run in another order than in one
process: the table says so and gives the difference instead of claiming exactness. Any other
difference is reported as unexpected.

A collective (it gathers every step): every rank calls it; each gets the same table.

Depends on `logical` and traces.
"""

from __future__ import annotations

from typing import Any

import torch

from ..traces.tables import pandas_module
from .logical import LogicalTrace

__all__ = ["compare_logical", "compare_value", "LOGICAL_COMPARE_COLUMNS"]

LOGICAL_COMPARE_COLUMNS = ("container_id", "variable", "block_path", "placement", "logical_shape", "exact",
                           "max_abs_diff", "reduced", "reason")

SUM_ORDER = "a sum over shards: the ranks' partial terms are added in another order than one process adds them"


def _signature(step: Any, root: str) -> tuple:
    """What a step is, whatever its number: where (the root's own steps under one name, since the
    sharded root may be another class), which call or op, which variable, which slot."""
    path = "" if step.block_path == root else step.block_path
    return path, step.op_name, step.out_var, step.slot_type


def _occurrences(trace: Any, root: str) -> dict:
    """signature -> the trace's steps with it, in run order (cached on the trace)."""
    cache = getattr(trace, "_signature_index", None)
    if cache is None or cache[0] != len(trace.steps):
        index: dict = {}
        for step in trace.steps:
            index.setdefault(_signature(step, root), []).append(step)
        cache = (len(trace.steps), index)
        try:
            trace._signature_index = cache
        except AttributeError:  # a trace type that takes no new attribute: rebuilt per call
            pass
    return cache[1]


def _twin(step: Any, reference: Any, root: str, trace: Any = None) -> Any:
    """The reference step of `step`: the same container id when it is the same step (signature), else
    the step of the same signature and the same occurrence.

    Step numbers (and so container ids) differ when the sharded model has fewer steps: a module
    whose `forward` a parallel style replaced (transformers' `tp_plan` installs `tp_forward`) runs
    as one opaque call, while the one-process model records the op inside it. Without `trace`
    (the sharded trace), the same number and variable."""
    mine = _signature(step, root)
    if step.container_id in reference:
        other = reference.by_container(step.container_id)
        if _signature(other, reference.root) == mine:
            return other
    if trace is not None:
        same = _occurrences(trace, root).get(mine, [])
        theirs = _occurrences(reference, reference.root).get(mine, [])
        position = next((i for i, s in enumerate(same) if s is step), None)
        if position is not None and position < len(theirs) and len(same) == len(theirs):
            return theirs[position]
        return None
    if 0 < step.step <= len(reference.steps):
        other = reference.steps[step.step - 1]
        same_block = other.block_path == step.block_path or (step.block_path == root and other.block_path == reference.root)
        if other.step == step.step and other.out_var == step.out_var and same_block:
            return other
    return None


def compare_value(step: Any, value: torch.Tensor, layout: Any, reference: Any, root: str, trace: Any = None) -> dict:
    """One gathered `value` (of `step`, placed as `layout`) against its twin in the one-process
    `reference` trace: {"exact", "max_abs_diff", "reason"} (the first two None when not compared).
    `trace`, the sharded trace `step` belongs to, finds twins whose numbers differ (`_twin`)."""
    twin = _twin(step, reference, root, trace)
    if twin is None:
        return {"exact": None, "max_abs_diff": None,
                "reason": "no step with this container id, or this variable at the same place, in the reference"}
    other = twin.value
    if other is None:
        return {"exact": None, "max_abs_diff": None, "reason": "the reference kept no value"}
    if tuple(other.shape) != tuple(value.shape) or other.dtype != value.dtype:
        return {"exact": False, "max_abs_diff": None,
                "reason": f"shape or dtype differs: {tuple(value.shape)} {value.dtype} vs the reference's "
                          f"{tuple(other.shape)} {other.dtype}"}
    exact = torch.equal(value, other.detach())
    diff = (value.detach().double() - other.detach().double()).abs()
    result = {"exact": exact, "max_abs_diff": float(diff.max()) if diff.numel() else 0.0}
    if exact:
        result["reason"] = "equal"
    elif layout.partial:
        result["reason"] = "a partial sum; gathered, it is " + SUM_ORDER
    elif layout.reduced:
        result["reason"] = "computed from " + SUM_ORDER
    else:
        result["reason"] = "UNEXPECTED: differs although no sum over shards is involved"
    return result


def compare_logical(trace: LogicalTrace, reference: Any) -> Any:
    """A DataFrame, one row per step of `trace` (columns `LOGICAL_COMPARE_COLUMNS`)."""
    if not isinstance(trace, LogicalTrace):
        raise TypeError(f"compare_logical needs the LogicalTrace of capture_logical, got {type(trace).__name__}")
    rows = []
    for step in trace.steps:
        layout = trace.placements[step.step]
        row = {"container_id": step.container_id, "variable": step.out_var, "block_path": step.block_path,
               "placement": layout.badge(), "logical_shape": None, "exact": None, "max_abs_diff": None,
               "reduced": layout.reduced, "reason": ""}
        rows.append(row)
        if not layout.known:
            row["reason"] = f"placement unknown ({layout.source}): not gathered"
            continue
        if step.value is None:
            row["reason"] = f"no value kept ({step.omitted})"
            continue
        value = trace.logical(step.container_id)
        row["logical_shape"] = tuple(value.shape)
        row.update(compare_value(step, value, layout, reference, trace.root, trace))
    return pandas_module().DataFrame(rows, columns=list(LOGICAL_COMPARE_COLUMNS))
