"""DataFrames of trace comparisons: one row per `TraceDiff` of `compare_traces`.

Per-step frames of one trace and the statistics live in `tables` (re-exported here for the views
that import them from this module). A view: depends on `compare`, `tables` and pandas (imported
when a frame is built); nothing in the package below the views imports it.
"""

from __future__ import annotations

from typing import Any, Sequence

from .compare import TraceDiff
from .tables import STAT_COLUMNS, STEP_COLUMNS, pandas_module, tensor_statistics, trace_to_dataframe, write_parquet

__all__ = ["STEP_COLUMNS", "STAT_COLUMNS", "DIFF_COLUMNS", "tensor_statistics", "trace_to_dataframe",
           "diffs_to_dataframe", "write_parquet"]

_NAN = float("nan")

DIFF_COLUMNS = ("container_id", "status", "changed", "max_abs_diff", "mean_abs_diff", "container_id_a",
                "container_id_b", "step_a", "step_b", "description", "out_var", "op_name", "block_path",
                "shape_a", "shape_b", "dtype_a", "dtype_b")


def diffs_to_dataframe(diffs: Sequence[TraceDiff]) -> Any:
    """One row per TraceDiff, in alignment order, columns `DIFF_COLUMNS`."""
    pandas = pandas_module()
    rows = []
    for diff in diffs:
        a, b, step = diff.step_a, diff.step_b, diff.step
        rows.append({
            "container_id": diff.container_id,
            "status": diff.status,
            "changed": diff.changed,
            "max_abs_diff": _NAN if diff.max_abs_diff is None else diff.max_abs_diff,
            "mean_abs_diff": _NAN if diff.mean_abs_diff is None else diff.mean_abs_diff,
            "container_id_a": diff.container_id_a,
            "container_id_b": diff.container_id_b,
            "step_a": a.step if a is not None else None,
            "step_b": b.step if b is not None else None,
            "description": step.description,
            "out_var": step.out_var,
            "op_name": step.op_name,
            "block_path": step.block_path,
            "shape_a": tuple(a.tensor.shape) if a is not None else None,
            "shape_b": tuple(b.tensor.shape) if b is not None else None,
            "dtype_a": a.tensor.dtype if a is not None else None,
            "dtype_b": b.tensor.dtype if b is not None else None,
        })
    return pandas.DataFrame(rows, columns=list(DIFF_COLUMNS))


