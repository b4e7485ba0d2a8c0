"""The inspector's view of a sharded run's logical values: whole-tensor shapes and statistics, and a
placement badge per value.

`logical_view_state(trace)` reads a `distributed.LogicalTrace` (the trace of `capture_logical`) and
gathers every step's whole value (a collective: **every rank calls it**, in the same order; each
gets the same state, and rank 0's widget shows it). Per step: container id, variable, block, the
placement badge (`S(0)@dp·S(2)@tp`, `R`, `P(sum)@tp`) and its words, the local and the logical
shape, the statistics of the whole tensor (`traces.tables.tensor_statistics`) and its histogram
bins; a step whose placement is unknown has no statistics and says why. Given a one-process
`reference` trace (`capture_run` of the unsharded model on the whole inputs), each gathered value
is also compared with its twin (`distributed.compare_value`: torch.equal, the largest absolute
difference and why they differ: a sum over shards, or unexpected). `logical_reply` is what
the browser's `logical` message gets: the state the kernel holds, or a clear error when no logical
trace was shown. `logical_module` is the browser code of the Logical tab (static/logical.js, built
apart from widget.js so that the initial widget state does not grow), sent when the tab first opens.

Depends on traces (statistics, bins) and distributed (the trace it reads).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..distributed.compare import compare_value
from ..distributed.logical import LogicalTrace
from ..distributed.placement import local_of
from ..schema.errors import NNSchemaError
from ..traces.histograms import histogram_bins
from ..traces.tables import tensor_statistics

__all__ = ["logical_view_state", "logical_reply", "logical_module", "LogicalViewError"]

_MODULE = Path(__file__).resolve().parent / "static" / "logical.js"


class LogicalViewError(NNSchemaError):
    """The logical view cannot be shown (no logical trace, or not one of capture_logical)."""


def _clean(stats: dict) -> dict:
    """JSON-safe statistics: NaN becomes None."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in stats.items()}


def logical_view_state(trace: Any, bins: int = 20, reference: Any = None) -> dict:
    """The logical view of `trace` (a collective over the ranks of its capture), compared with the
    one-process `reference` trace when given."""
    if not isinstance(trace, LogicalTrace):
        raise LogicalViewError(f"the logical view needs the LogicalTrace of capture_logical, got {type(trace).__name__}; "
                               "run nnschemaparser.distributed.capture_logical(schema, inputs) on every rank")
    if reference is not None and not hasattr(reference, "by_container"):
        raise LogicalViewError(f"the reference must be a one-process trace (capture_run(...).trace), got "
                               f"{type(reference).__name__}")
    rows = []
    for step in trace.steps:
        layout = trace.placements[step.step]
        row = {"container_id": step.container_id, "step": step.step, "var": step.out_var, "block": step.block_path,
               "slot_type": step.slot_type, "badge": layout.badge(), "placement": layout.describe(),
               "source": layout.source, "reduced": layout.reduced,
               "local_shape": list(local_of(step.value).shape) if step.value is not None else list(step.tensor.shape),
               "logical_shape": None, "stats": None, "bins": None, "note": None, "compare": None}
        if not layout.known:
            row["note"] = f"placement unknown ({layout.source}): the whole value cannot be gathered"
        elif step.value is None:
            row["note"] = f"no value kept ({step.omitted})"
        else:
            value = trace.logical(step.container_id)
            row["logical_shape"] = list(value.shape)
            row["stats"] = _clean(tensor_statistics(value))
            if value.is_floating_point() and value.numel():
                row["bins"] = histogram_bins(value, bins=bins).to_dict()
            if reference is not None:
                row["compare"] = compare_value(step, value, layout, reference, trace.root, trace)
        rows.append(row)
    mesh = trace.world
    return {"mesh": {"dims": list(trace.mesh_dim_names), "shape": list(mesh.mesh.shape)},
            "root": trace.root, "rows": rows, "compared": reference is not None,
            "exact": sum(1 for r in rows if r["compare"] and r["compare"]["exact"]), "ranks": int(mesh.mesh.numel())}


def logical_reply(state: Any) -> dict:
    """The browser's `logical` request: the logical view the kernel holds."""
    view = getattr(state, "logical_view", None)
    if view is None:
        raise LogicalViewError("no logical view in this inspector: call widget.show_logical(record.trace) on every "
                               "rank after capture_logical (rank 0's widget then shows it)")
    return view


def logical_module() -> dict:
    """The browser's `logical_module` request: the Logical tab's code (an ES module's source)."""
    if not _MODULE.is_file():
        raise LogicalViewError(f"{_MODULE} is missing: rebuild the browser files (python -m nnschemaparser.widget.build)")
    return {"code": _MODULE.read_text(encoding="utf-8")}
