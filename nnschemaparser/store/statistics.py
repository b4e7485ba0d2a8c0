"""The per-step statistics a store writes: their Parquet schema and how one input's steps become rows.

The statistics are those of `traces.tables.tensor_statistics` (torch on a float64 copy, NaN
propagating through mean/min/max, the unbiased std), computed for a whole input at once: one small
float64 vector per step, stacked and read back with a single `tolist()`, so an input with a
thousand steps pays one transfer to Python instead of ten per step. The values are the same floats
`tensor_statistics` gives (the same torch calls, in float64).

Depends on torch and pyarrow (imported when a table is built); never on the runtime or views.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import torch

__all__ = ["COLUMNS", "arrow_schema", "step_rows", "rows_table"]

_NAN = float("nan")
# name, arrow type name (see arrow_schema)
COLUMNS = (("sample", "int64"), ("step", "int32"), ("container_id", "string"), ("slot_type", "string"),
           ("block_path", "string"), ("out_var", "string"), ("op_name", "string"), ("description", "string"),
           ("frame_depth", "int32"), ("shape", "list<int64>"), ("dtype", "string"), ("numel", "int64"),
           ("mean", "double"), ("std", "double"), ("min", "double"), ("max", "double"), ("abs_sum", "double"),
           ("l2", "double"), ("n_nan", "int64"), ("n_inf", "int64"), ("frac_zero", "double"), ("kept", "bool"),
           ("omitted", "string"))
_STAT_KEYS = ("mean", "std", "min", "max", "abs_sum", "l2", "n_nan", "n_inf", "frac_zero")


def arrow_schema() -> Any:
    import pyarrow as pa

    types = {"int64": pa.int64(), "int32": pa.int32(), "string": pa.string(), "double": pa.float64(),
             "bool": pa.bool_(), "list<int64>": pa.list_(pa.int64())}
    return pa.schema([(name, types[kind]) for name, kind in COLUMNS])


def _vector(value: Any) -> Any:
    """(numel, the float64 statistics vector) of a tensor, or a list of ready values when torch has none to give."""
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided or value.is_meta:
        numel = int(value.numel()) if isinstance(value, torch.Tensor) else 0
        return [numel, _NAN, _NAN, _NAN, _NAN, _NAN, _NAN, None, None, _NAN]
    data = value.detach()
    if data.is_complex():
        data = data.abs()
    data = data.to(device="cpu", dtype=torch.float64)
    numel = data.numel()
    if numel == 0:
        return [0, _NAN, _NAN, _NAN, _NAN, 0.0, 0.0, 0, 0, _NAN]
    std = data.std() if numel > 1 else torch.tensor(_NAN, dtype=torch.float64)
    return numel, torch.stack([data.mean(), std, data.min(), data.max(), data.abs().sum(),
                               torch.linalg.vector_norm(data), torch.isnan(data).sum().to(torch.float64),
                               torch.isinf(data).sum().to(torch.float64), (data == 0).sum().to(torch.float64)])


def step_rows(sample: int, steps: Iterable[Any], kept: set[int]) -> list[tuple]:
    """One row (COLUMNS order) per TraceStep of an input; `kept`: the step numbers whose tensor is written."""
    steps = list(steps)
    vectors = [_vector(step.tensor.value) for step in steps]
    stacked = [v[1] for v in vectors if not isinstance(v, list)]
    values = iter(torch.stack(stacked).tolist() if stacked else [])
    rows = []
    for step, vector in zip(steps, vectors):
        if isinstance(vector, list):
            numel, stats = vector[0], list(vector[1:])
            if step.tensor.value is None:
                numel = math.prod(step.tensor.shape) if step.tensor.shape else 1
        else:
            numel = vector[0]
            mean, std, low, high, abs_sum, l2, nans, infs, zeros = next(values)
            stats = [mean, std, low, high, abs_sum, l2, int(nans), int(infs), zeros / numel]
        rows.append((sample, step.step, step.container_id, step.slot_type, step.block_path, step.out_var,
                     step.op_name, step.description, step.frame_depth, [int(d) for d in step.tensor.shape],
                     str(step.tensor.dtype), numel, *stats, step.step in kept, step.omitted))
    return rows


def rows_table(rows: list[tuple]) -> Any:
    """The pyarrow Table of `rows` (COLUMNS order)."""
    import pyarrow as pa

    columns = list(zip(*rows)) if rows else [[] for _ in COLUMNS]
    return pa.Table.from_arrays([pa.array(list(col), type=field.type) for col, field in zip(columns, arrow_schema())],
                                schema=arrow_schema())
