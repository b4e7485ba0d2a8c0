"""Step-by-step comparison of two traces: `compare_traces`, `TraceDiff`, `diff_summary`, `first_divergence`.

Alignment. Two runs of one schema on the same control path produce the same container ids, and the
steps pair up by id. When the control path differs (a branch taken in one run only, one more loop
iteration), the step numbers after the change shift and ids stop matching, so steps are paired by
role instead: (slot_type, block_path, out_var, op_name). The common prefix and suffix of the role
sequences pair up directly; the stretch in between is aligned with a longest-matching-subsequence
pass, and whatever stays unpaired is reported as only_in_a / only_in_b.

Values are compared in float64. NaN against NaN and equal infinities count as equal; a NaN or an
infinity against anything else is an infinite difference.

Depends on traces only (and torch); never on the interpreter or any view.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from .trace import TraceStep

__all__ = ["TraceDiff", "compare_traces", "diff_summary", "first_divergence", "STATUSES"]

STATUSES = ("ok", "shape_changed", "only_in_a", "only_in_b")


@dataclass
class TraceDiff:
    """One aligned pair of steps (or a step present in one trace only).

    `status`: "ok" (both present, same shape), "shape_changed", "only_in_a" or "only_in_b".
    `max_abs_diff` / `mean_abs_diff` are set when both values are present with the same shape;
    `changed` is True when the values differ by more than `atol`, the dtype changed, or the status
    is not "ok"; None when a value was left out by capture limits.
    """

    container_id: str
    status: str
    changed: Optional[bool]
    max_abs_diff: Optional[float] = None
    mean_abs_diff: Optional[float] = None
    step_a: Optional[TraceStep] = None
    step_b: Optional[TraceStep] = None

    @property
    def container_id_a(self) -> Optional[str]:
        return self.step_a.container_id if self.step_a is not None else None

    @property
    def container_id_b(self) -> Optional[str]:
        return self.step_b.container_id if self.step_b is not None else None

    @property
    def step(self) -> TraceStep:
        """The step this diff is about (trace A's when it has one)."""
        return self.step_a if self.step_a is not None else self.step_b  # type: ignore[return-value]

    def describe(self) -> str:
        step = self.step
        where = f"step {step.step} ({step.description}, var {step.out_var or '-'}, block {step.block_path or '-'})"
        if self.status == "ok":
            detail = f"max |a-b| = {self.max_abs_diff:.6g}" if self.max_abs_diff is not None else "values not kept"
        elif self.status == "shape_changed":
            detail = f"shape {self.step_a.tensor.shape} -> {self.step_b.tensor.shape}"
        else:
            detail = self.status.replace("_", " ")
        return f"{self.container_id} at {where}: {detail}"


def _role(step: TraceStep) -> tuple:
    return step.slot_type, step.block_path, step.out_var, step.op_name


def _align(a: Sequence[TraceStep], b: Sequence[TraceStep]) -> list[tuple[Optional[TraceStep], Optional[TraceStep]]]:
    if len(a) == len(b) and all(x.container_id == y.container_id and _role(x) == _role(y) for x, y in zip(a, b)):
        return list(zip(a, b))
    roles_a = [_role(s) for s in a]
    roles_b = [_role(s) for s in b]
    head = 0
    limit = min(len(a), len(b))
    while head < limit and roles_a[head] == roles_b[head]:
        head += 1
    tail = 0
    while tail < limit - head and roles_a[len(a) - 1 - tail] == roles_b[len(b) - 1 - tail]:
        tail += 1
    pairs: list[tuple[Optional[TraceStep], Optional[TraceStep]]] = list(zip(a[:head], b[:head]))
    mid_a, mid_b = a[head:len(a) - tail], b[head:len(b) - tail]
    matcher = difflib.SequenceMatcher(None, roles_a[head:len(a) - tail], roles_b[head:len(b) - tail],
                                      autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            pairs.extend(zip(mid_a[i1:i2], mid_b[j1:j2]))
            continue
        pairs.extend((step, None) for step in mid_a[i1:i2])
        pairs.extend((None, step) for step in mid_b[j1:j2])
    pairs.extend(zip(a[len(a) - tail:], b[len(b) - tail:]))
    return pairs


def _value_diff(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    if x.numel() == 0:
        return 0.0, 0.0
    wide = torch.complex128 if x.is_complex() or y.is_complex() else torch.float64
    x = x.detach().to(device="cpu", dtype=wide)
    y = y.detach().to(device="cpu", dtype=wide)
    same = (x == y) | (torch.isnan(x) & torch.isnan(y))
    gap = (x - y).abs()  # real even for complex inputs
    gap = torch.nan_to_num(torch.where(same, torch.zeros_like(gap), gap), nan=math.inf)
    return gap.max().item(), gap.mean().item()


def _pair_diff(a: Optional[TraceStep], b: Optional[TraceStep], atol: float) -> TraceDiff:
    if b is None:
        return TraceDiff(a.container_id, "only_in_a", True, step_a=a)
    if a is None:
        return TraceDiff(b.container_id, "only_in_b", True, step_b=b)
    cid = a.container_id
    if tuple(a.tensor.shape) != tuple(b.tensor.shape):
        return TraceDiff(cid, "shape_changed", True, step_a=a, step_b=b)
    va, vb = a.tensor.value, b.tensor.value
    if not isinstance(va, torch.Tensor) or not isinstance(vb, torch.Tensor):
        return TraceDiff(cid, "ok", None, step_a=a, step_b=b)
    biggest, mean = _value_diff(va, vb)
    changed = biggest > atol or a.tensor.dtype != b.tensor.dtype
    return TraceDiff(cid, "ok", changed, biggest, mean, a, b)


def compare_traces(trace_a: Any, trace_b: Any, atol: float = 0.0) -> list[TraceDiff]:
    """Pair the steps of two traces (by container id, by role across control-path changes) and diff them.

    Works for activation and gradient traces alike. `atol` is the largest absolute difference
    still counted as unchanged (0.0: any difference counts).
    """
    for name, trace in (("trace_a", trace_a), ("trace_b", trace_b)):
        if not hasattr(trace, "steps"):
            raise TypeError(f"{name} must be an ActivationTrace or GradientTrace (record.trace, recorder.trace), "
                            f"got {type(trace).__name__}")
    if not isinstance(atol, (int, float)) or isinstance(atol, bool) or not atol >= 0:
        raise ValueError(f"atol must be a non-negative number, got {atol!r}")
    return [_pair_diff(a, b, float(atol)) for a, b in _align(list(trace_a.steps), list(trace_b.steps))]


def diff_summary(diffs: Sequence[TraceDiff]) -> dict[str, int]:
    """Counts: total, one per status, changed and unchanged (pairs whose values match within atol)."""
    summary = {"total": len(diffs), **{status: 0 for status in STATUSES}, "changed": 0, "unchanged": 0}
    for diff in diffs:
        summary[diff.status] += 1
        if diff.changed:
            summary["changed"] += 1
        elif diff.changed is False:
            summary["unchanged"] += 1
    return summary


def first_divergence(diffs: Sequence[TraceDiff]) -> Optional[TraceDiff]:
    """The first diff, in run order, whose step changed or exists in one trace only; None if none."""
    for diff in diffs:
        if diff.changed or diff.status != "ok":
            return diff
    return None
