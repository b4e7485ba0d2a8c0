"""What the inspector's tensor views draw, computed in Python: 2-D slices, attention heads, trends.

`heatmap_slice` cuts a 2-D slice out of a tensor (two dims shown, every other dim fixed at an
index; default: the last two dims, index 0 elsewhere) and returns its values row-major with the
range of the whole slice (so the colours and the legend mean the same with or without striding);
a slice with values of both signs gets a diverging scale centred on 0: its colours span `range`
[-m, m], m the largest magnitude (`min` and `max` stay the slice's own ends). A slice larger than `MAX_SIDE` cells per side is *strided*, not averaged: every k-th row
and column is shown, and `row_ids` / `col_ids` give the original index of each shown one, so every
drawn cell is a value of the tensor, bit for bit (float64 holds every float32/float16/bfloat16 and
every int up to 2**53 exactly). `heatmap_diff` is the same for `b - a` of two runs at one step,
with a symmetric range for a diverging colour scale.

`attention_heads` recognises attention weights: a 4-D floating tensor `[batch, heads, q, k]` that
a softmax or scaled-dot-product-attention call produced, or, when the producer is not visible
(`transformers`' eager attention is a plain function whose result reaches the trace through a tuple),
whose rows are non-negative and sum to 1. It returns the patterns of up to `MAX_HEADS` heads, each
capped at `MAX_TOKENS` queries and keys, with token labels from the inputs' `input_ids`.

`step_trends` gives per-variable series of a stat (mean, std, norm, frac_zeros) across a run's trace
steps; `layer_series` gives one value per layer of a `ModuleList` (the last step of a variable in
each block `prefix.N`), e.g. the norm of `hidden_states` after each decoder layer.

Depends on the traces (TraceStep, RunRecord's trace) and torch; knows nothing about the browser.
"""

from __future__ import annotations

import math
import re
from typing import Any, Optional, Sequence

import torch

from ..schema.errors import NNSchemaError

__all__ = ["TensorViewError", "heatmap_slice", "heatmap_diff", "attention_heads", "is_attention",
           "tensor_stat", "step_trends", "layer_series", "node_colours", "STATS", "MAX_SIDE", "MAX_HEADS", "MAX_TOKENS"]

MAX_SIDE = 128  # cells per side of a heatmap; a larger slice shows every k-th row / column
MAX_HEADS = 16
MAX_TOKENS = 64
STATS = ("mean", "std", "norm", "frac_zeros")
_ATTENTION_OPS = ("softmax", "scaled_dot_product_attention", "sdpa")
_LAYER = re.compile(r"^(?P<prefix>.+)\.(?P<index>\d+)$")


class TensorViewError(NNSchemaError):
    """A tensor view the inspector cannot draw (no tensor, a dim or index out of range, shapes differ)."""


def _as_float(value: Any, what: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TensorViewError(f"{what} is a {type(value).__name__}, not a tensor; pick a step that binds a tensor")
    if value.is_complex():
        raise TensorViewError(f"{what} is complex ({value.dtype}); the heatmap draws real values only, "
                              f"view value.abs() or value.real with an expression edit")
    if value.layout != torch.strided:
        value = value.to_dense()
    return value.detach().to(device="cpu", dtype=torch.float64)


def _normalise_dims(shape: Sequence[int], dims: Optional[Sequence[int]], index: Optional[Sequence[Optional[int]]]
                    ) -> tuple[list[int], list[Optional[int]]]:
    ndim = len(shape)
    if ndim == 0:
        raise TensorViewError("the value is a 0-d tensor (one number): there is no slice to draw")
    if dims is None:
        dims = [ndim - 2, ndim - 1] if ndim >= 2 else [0]
    dims = [int(d) for d in dims]
    if not 1 <= len(dims) <= 2 or len(set(dims)) != len(dims):
        raise TensorViewError(f"dims must be one or two distinct dims to show, got {list(dims)}")
    dims = [d + ndim if d < 0 else d for d in dims]
    if any(not 0 <= d < ndim for d in dims):
        raise TensorViewError(f"dims {list(dims)} are out of range for a {ndim}-d tensor of shape {list(shape)}")
    fixed: list[Optional[int]] = [None] * ndim
    given = list(index) if index is not None else []
    if len(given) > ndim:
        raise TensorViewError(f"index has {len(given)} entries for a {ndim}-d tensor of shape {list(shape)}")
    for d in range(ndim):
        if d in dims:
            continue
        i = given[d] if d < len(given) and given[d] is not None else 0
        i = int(i)
        if not 0 <= i < shape[d]:
            raise TensorViewError(f"index {i} is out of range for dim {d} of size {shape[d]} (shape {list(shape)})")
        fixed[d] = i
    return dims, fixed


def _ordinal(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix}"


def _strided(n: int, cap: int) -> list[int]:
    stride = max(1, math.ceil(n / cap))
    return list(range(0, n, stride))


def _cut(data: torch.Tensor, dims: list[int], fixed: list[Optional[int]], max_side: int) -> dict:
    selector = tuple(slice(None) if f is None else f for f in fixed)
    plane = data[selector]  # the shown dims, in their order in the tensor
    if len(dims) == 2 and dims[0] > dims[1]:
        plane = plane.transpose(0, 1)
    if plane.dim() == 1:
        plane = plane.unsqueeze(0)
    rows, cols = plane.shape
    row_ids, col_ids = _strided(rows, max_side), _strided(cols, max_side)
    shown = plane[row_ids][:, col_ids]
    low, high = _finite_range(plane)  # the whole slice's range, strided or not: the legend tells the truth
    return {"plane": shown, "row_ids": row_ids, "col_ids": col_ids, "rows": rows, "cols": cols, "low": low,
            "high": high}


def _finite_range(values: torch.Tensor) -> tuple[Optional[float], Optional[float]]:
    finite = values[torch.isfinite(values)]
    if finite.numel() == 0:
        return None, None
    return float(finite.min()), float(finite.max())


def _payload(cut: dict, shape: Sequence[int], dims: list[int], fixed: list[Optional[int]], max_side: int) -> dict:
    plane = cut["plane"]
    strided = len(cut["row_ids"]) < cut["rows"] or len(cut["col_ids"]) < cut["cols"]
    note = ""
    if strided:
        def part(ids: list[int], n: int, what: str) -> str:
            k = ids[1] if len(ids) > 1 else n
            return f"all {n} {what}" if len(ids) == n else f"every {_ordinal(k)} of {n} {what}"

        note = (f"strided to at most {max_side} per side: {part(cut['row_ids'], cut['rows'], 'rows')}, "
                f"{part(cut['col_ids'], cut['cols'], 'columns')}")
    return {"shape": list(shape), "dims": dims, "index": fixed, "rows": cut["rows"], "cols": cut["cols"],
            "row_ids": cut["row_ids"], "col_ids": cut["col_ids"], "values": plane.reshape(-1).tolist(),
            "strided": strided, "max_side": max_side, "note": note}


def heatmap_slice(value: Any, dims: Optional[Sequence[int]] = None, index: Optional[Sequence[Optional[int]]] = None,
                  max_side: int = MAX_SIDE) -> dict:
    """The 2-D slice `value[index with dims kept]` as {values (row-major), rows, cols, row_ids, col_ids,
    min, max, scale, ...}; `index[d]` fixes every dim not in `dims` (default 0)."""
    data = _as_float(value, "the value")
    dims, fixed = _normalise_dims(list(data.shape), dims, index)
    cut = _cut(data, dims, fixed, max_side)
    out = _payload(cut, list(data.shape), dims, fixed, max_side)
    low, high = cut["low"], cut["high"]
    if low is not None and low < 0 < high:  # signed values: a diverging scale with 0 in the middle
        bound = max(-low, high)
        out.update(min=low, max=high, scale="diverging", range=[-bound, bound])
    else:
        out.update(min=low, max=high, scale="sequential", range=[low, high])
    out["dtype"] = str(value.dtype).replace("torch.", "")
    return out


def heatmap_diff(a: Any, b: Any, dims: Optional[Sequence[int]] = None, index: Optional[Sequence[Optional[int]]] = None,
                 max_side: int = MAX_SIDE) -> dict:
    """`b - a` (in float64) as a heatmap slice with a symmetric range, for a diverging colour scale."""
    left, right = _as_float(a, "run A's value"), _as_float(b, "run B's value")
    if left.shape != right.shape:
        raise TensorViewError(f"the two runs' values have different shapes, {list(left.shape)} and "
                              f"{list(right.shape)}: there is no cell-by-cell difference; compare their histograms")
    dims, fixed = _normalise_dims(list(left.shape), dims, index)
    cut = _cut(right - left, dims, fixed, max_side)
    out = _payload(cut, list(left.shape), dims, fixed, max_side)
    low, high = cut["low"], cut["high"]
    bound = max(abs(low), abs(high)) if low is not None else None
    out.update(min=-bound if bound is not None else None, max=bound, scale="diverging", dtype="float64",
               range=[-bound if bound is not None else None, bound])
    return out


def is_attention(value: Any, op_name: str = "") -> str:
    """Why `value` is attention weights ("softmax producer", "row-stochastic") or "" when it is not."""
    if not isinstance(value, torch.Tensor) or value.dim() != 4 or not value.is_floating_point() or value.numel() == 0:
        return ""
    name = (op_name or "").lower()
    if any(op in name for op in _ATTENTION_OPS):
        return "softmax producer"
    data = value.detach().to(device="cpu", dtype=torch.float64)
    if not bool(torch.isfinite(data).all()) or bool((data < 0).any()):
        return ""
    sums = data.sum(dim=-1)
    tolerance = 1e-2 if value.dtype in (torch.float16, torch.bfloat16) else 1e-4
    return "row-stochastic" if bool(((sums - 1).abs() <= tolerance).all()) else ""


def attention_heads(value: Any, op_name: str = "", batch: int = 0, tokens: Optional[Sequence[str]] = None,
                    max_heads: int = MAX_HEADS, max_tokens: int = MAX_TOKENS) -> dict:
    """The per-head patterns of attention weights `[batch, heads, q, k]`, or {"attention": False}."""
    reason = is_attention(value, op_name)
    if not reason:
        return {"attention": False, "note": "not attention weights: needs a 4-d [batch, heads, q, k] tensor from a "
                                           "softmax, or whose rows are non-negative and sum to 1"}
    n_batch, n_heads, n_q, n_k = value.shape
    if not 0 <= int(batch) < n_batch:
        raise TensorViewError(f"batch {batch} is out of range for {n_batch} sequences")
    data = value.detach().to(device="cpu", dtype=torch.float64)[int(batch)]
    heads = list(range(min(n_heads, max_heads)))
    q, k = min(n_q, max_tokens), min(n_k, max_tokens)
    patterns = [data[h, :q, :k].reshape(-1).tolist() for h in heads]
    labels = None
    if tokens is not None:
        labels = [str(t) for t in list(tokens)[:max(q, k)]]
    notes = []
    if len(heads) < n_heads:
        notes.append(f"first {len(heads)} of {n_heads} heads")
    if q < n_q or k < n_k:
        notes.append(f"first {q} queries and {k} keys of {n_q} x {n_k} (at most {max_tokens})")
    return {"attention": True, "reason": reason, "batch": int(batch), "batches": n_batch, "heads": n_heads,
            "shown_heads": heads, "q": q, "k": k, "patterns": patterns, "tokens": labels, "note": "; ".join(notes)}


def tensor_stat(value: Any, stat: str) -> Optional[float]:
    """One number of a tensor: mean, std, norm (L2) or frac_zeros; None for a value that is not a tensor."""
    if stat not in STATS:
        raise TensorViewError(f"unknown stat {stat!r}; the stats are {', '.join(STATS)}")
    if not isinstance(value, torch.Tensor) or value.numel() == 0 or value.is_complex():
        return None
    data = value.detach().to(device="cpu", dtype=torch.float64)
    if stat == "mean":
        return float(data.mean())
    if stat == "std":
        return float(data.std()) if data.numel() > 1 else 0.0
    if stat == "norm":
        return float(torch.linalg.vector_norm(data))
    return float((data == 0).sum()) / data.numel()


def step_trends(steps: Sequence[Any], stat: str = "norm", include_temporaries: bool = False,
                max_series: int = 200) -> dict:
    """Per variable (by block and name), the stat at each of its trace steps, in run order."""
    series: dict[tuple[str, str], dict] = {}
    for step in steps:
        var = step.out_var or ""
        if not var or (var.startswith("$") and not include_temporaries):
            continue
        key = (step.block_path, var)
        if key not in series:
            if len(series) >= max_series:
                continue
            series[key] = {"block": step.block_path, "var": var, "steps": [], "values": []}
        series[key]["steps"].append(step.step)
        series[key]["values"].append(tensor_stat(step.tensor.value, stat))
    return {"stat": stat, "series": list(series.values()), "capped": len(series) >= max_series}


def layer_series(steps: Sequence[Any], var: str, stat: str = "norm", running: Sequence[str] = ()) -> dict:
    """For `var`, one value per layer of the ModuleList with the most layers: the stat of the last
    trace step of `var` in each block `prefix.N` (its own sub-blocks are not counted). Layers in
    `running` (blocks a paused run is still inside) have not returned and are left out."""
    found: dict[str, dict[int, Any]] = {}
    skip = set(running)
    for step in steps:
        match = _LAYER.match(step.block_path or "")
        if match is None or step.out_var != var or step.block_path in skip:
            continue
        found.setdefault(match["prefix"], {})[int(match["index"])] = step
    if not found:
        raise TensorViewError(f"no variable {var!r} in a block of a ModuleList (a path ending in .N) in this run")
    prefix = max(found, key=lambda p: (len(found[p]), p))
    layers = sorted(found[prefix])
    return {"var": var, "stat": stat, "prefix": prefix, "layers": layers,
            "steps": [found[prefix][i].step for i in layers],
            "values": [tensor_stat(found[prefix][i].tensor.value, stat) for i in layers]}


def node_colours(step_rows: Sequence[dict], values_by_trace_step: dict[int, Optional[float]], what: str,
                 holders: Optional[dict[int, int]] = None) -> dict:
    """One number per tree node for colouring the tree: for each node, the value of the last StepInfo
    of that node (a loop's last iteration) whose trace step has a value in `values_by_trace_step`.
    `holders` maps a node to the row holding it (an instruction to its statement row): the holder
    gets the value of the last of its nodes to have one."""
    values: dict[int, float] = {}
    holders = holders or {}
    for row in step_rows:
        node, trace_step = row.get("node", -1), row.get("trace_step")
        if node is None or node < 0 or trace_step is None:
            continue
        value = values_by_trace_step.get(trace_step)
        if value is not None and math.isfinite(value):
            values[node] = value
            if node in holders:
                values[holders[node]] = value
    finite = list(values.values())
    return {"what": what, "values": {str(k): v for k, v in values.items()},
            "min": min(finite) if finite else None, "max": max(finite) if finite else None}
