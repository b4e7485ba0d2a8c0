"""Per-step tables of a trace: one definition of the tensor statistics, rows, DataFrames, Parquet.

`tensor_statistics` is the one definition of the per-tensor statistics (reused by every view):
every number comes from torch on a float64 copy, with torch's own semantics (NaN propagates through
mean/min/max, `std` is the unbiased estimate). `trace_to_dataframe` serves
`ActivationTrace.to_dataframe()` / `GradientTrace.to_dataframe()`; `write_parquet` exports a frame
when pyarrow is installed.

Depends on torch, and on pandas only when a frame is built; it imports nothing of the package, so
`trace` can import it without a circle.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

__all__ = ["STEP_COLUMNS", "STAT_COLUMNS", "tensor_statistics", "trace_to_dataframe", "write_parquet", "pandas_module"]

STAT_COLUMNS = ("numel", "mean", "std", "min", "max", "abs_sum", "l2", "n_nan", "n_inf", "frac_zero")
STEP_COLUMNS = ("step", "container_id", "slot_type", "description", "out_var", "op_name", "block_path",
                "frame_depth", "shape", "dtype") + STAT_COLUMNS + ("source_container_id", "omitted")

_NAN = float("nan")


def pandas_module() -> Any:
    try:
        import pandas
    except ImportError as exc:  # pragma: no cover - pandas is a declared dependency of the views
        raise ImportError("DataFrames of traces need pandas: pip install pandas") from exc
    return pandas


def tensor_statistics(value: Any) -> dict[str, Any]:
    """numel, mean, std, min, max, abs_sum, l2, n_nan, n_inf, frac_zero of a tensor (NaN when absent).

    Booleans count as 0/1; complex tensors are summarised by their magnitudes.
    """
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided or value.is_meta:
        numel = int(value.numel()) if isinstance(value, torch.Tensor) else 0
        return {"numel": numel, "mean": _NAN, "std": _NAN, "min": _NAN, "max": _NAN, "abs_sum": _NAN,
                "l2": _NAN, "n_nan": None, "n_inf": None, "frac_zero": _NAN}
    data = value.detach()
    if data.is_complex():
        data = data.abs()
    data = data.to(device="cpu", dtype=torch.float64)
    numel = data.numel()
    if numel == 0:
        return {"numel": 0, "mean": _NAN, "std": _NAN, "min": _NAN, "max": _NAN, "abs_sum": 0.0, "l2": 0.0,
                "n_nan": 0, "n_inf": 0, "frac_zero": _NAN}
    return {
        "numel": numel,
        "mean": data.mean().item(),
        "std": data.std().item() if numel > 1 else _NAN,
        "min": data.min().item(),
        "max": data.max().item(),
        "abs_sum": data.abs().sum().item(),
        "l2": torch.linalg.vector_norm(data).item(),
        "n_nan": int(torch.isnan(data).sum().item()),
        "n_inf": int(torch.isinf(data).sum().item()),
        "frac_zero": (data == 0).sum().item() / numel,
    }


def _step_row(step: Any) -> dict[str, Any]:
    row = {
        "step": step.step,
        "container_id": step.container_id,
        "slot_type": step.slot_type,
        "description": step.description,
        "out_var": step.out_var,
        "op_name": step.op_name,
        "block_path": step.block_path,
        "frame_depth": step.frame_depth,
        "shape": tuple(step.tensor.shape),
        "dtype": step.tensor.dtype,
    }
    stats = tensor_statistics(step.tensor.value)
    if step.tensor.value is None:
        stats["numel"] = math.prod(step.tensor.shape) if step.tensor.shape else 1
    row.update(stats)
    row["source_container_id"] = step.source_container_id
    row["omitted"] = step.omitted
    return row


def trace_to_dataframe(trace: Any) -> Any:
    """One row per step of an activation or gradient trace, columns `STEP_COLUMNS`.

    A gradient frame's `source_container_id` is the activation id: join the two frames with
    `activations.merge(gradients, left_on="container_id", right_on="source_container_id")`.
    """
    pandas = pandas_module()
    return pandas.DataFrame([_step_row(step) for step in trace.steps], columns=list(STEP_COLUMNS))


def write_parquet(frame: Any, path: str | Path) -> Path:
    """Write a frame of this module as Parquet; needs pyarrow (pip install pyarrow)."""
    try:
        import pyarrow  # noqa: F401
    except ImportError as exc:
        raise ImportError("Parquet export needs pyarrow: pip install pyarrow") from exc
    path = Path(path)
    frame.to_parquet(path, index=False)
    return path
