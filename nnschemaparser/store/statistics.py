"""The per-step statistics a store writes: their Parquet schema and how one input's steps become rows.

The columns are those of `traces.tables.tensor_statistics` (numel, mean, std, min, max, abs_sum,
l2, NaN and inf counts, fraction of zeros), computed the way a store can afford for every step of
thousands of inputs: a few vectorised passes in the tensor's own dtype (float16 and bfloat16 in
float32, integers and booleans in float64), no float64 copy: the sum, min and max together, the sum
and the least of the magnitudes, the dot product with itself. An input's figures are stacked and
read back with one `tolist()`. NaN and inf are counted only for a tensor whose sums are not finite
(finite sums have neither), zeros only for one whose least magnitude is 0; a tensor whose sums
overflow its dtype without holding NaN or inf (an attention mask of float32 minima) has them redone
in float64.

So min, max, the NaN, inf and zero counts are exactly `tensor_statistics`'s; mean, abs_sum and l2
are accumulated in the tensor's dtype (for float32 activations abs_sum and l2 are within about 1e-6
relative of the float64 figures of `tensor_statistics`, mean within about 1e-6 of the mean
magnitude: a mean near zero, as a LayerNorm output's, has a small absolute error only), and std
comes from the sums
(`(l2**2 - sum**2 / n) / (n - 1)` in float64), which loses precision when the mean dwarfs the
spread. Measured against `tensor_statistics` in tests/store/test_writer.py.

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


_F64 = torch.float64
_NATIVE = (torch.float32, torch.float64)


def _vector(value: Any) -> Any:
    """(numel, the vector [sum, min, max, abs sum, least magnitude, dot], the data) of a tensor, or a list
    of ready values when torch has none to give."""
    if not isinstance(value, torch.Tensor) or value.layout != torch.strided or value.is_meta:
        numel = int(value.numel()) if isinstance(value, torch.Tensor) else 0
        return [numel, _NAN, _NAN, _NAN, _NAN, _NAN, _NAN, None, None, _NAN]
    data = value.detach()
    if data.is_complex():
        data = data.abs()
    if data.device.type != "cpu":
        data = data.to("cpu")
    if data.dtype not in _NATIVE:
        data = data.to(torch.float32 if data.is_floating_point() else _F64)
    numel = data.numel()
    if numel == 0:
        return [0, _NAN, _NAN, _NAN, _NAN, 0.0, 0.0, 0, 0, _NAN]
    flat = data.reshape(-1)
    magnitude = flat.abs()
    low, high = torch.aminmax(flat)
    vector = torch.stack([flat.sum(), low, high, magnitude.sum(), magnitude.amin(), torch.dot(flat, flat)])
    return numel, vector.to(_F64), flat


def step_rows(sample: int, steps: Iterable[Any], kept: set[int]) -> list[tuple]:
    """One row (COLUMNS order) per TraceStep of an input; `kept`: the step numbers whose tensor is written."""
    steps = list(steps)
    # A tensor held by several steps (a block's result is its last op's tensor, bound again by the
    # caller) is summarised once: the steps hold the same object, as captured.
    memo: dict[int, Any] = {}
    vectors = []
    for step in steps:
        value = step.tensor.value
        if isinstance(value, torch.Tensor):
            vector = memo.get(id(value))
            if vector is None:
                vector = memo[id(value)] = _vector(value)
            vectors.append(vector)
        else:
            vectors.append(_vector(value))
    computed = list({id(v): v for v in vectors if not isinstance(v, list)}.values())
    slot = {id(v): i for i, v in enumerate(computed)}
    figures = torch.stack([v[1] for v in computed]).tolist() if computed else []
    # the rare tensors with NaN or inf (a sum that is not finite), with sums that overflow their dtype
    # (an attention mask of float32 minima) or with zeros (a least magnitude of 0): count them, and redo
    # the sums in float64 where nothing but the overflow made them infinite
    odd = [i for i, f in enumerate(figures) if not (math.isfinite(f[0]) and math.isfinite(f[3])
                                                    and math.isfinite(f[5])) or f[4] == 0]
    counts = torch.stack([torch.stack([torch.isnan(computed[i][2]).sum(), torch.isinf(computed[i][2]).sum(),
                                       (computed[i][2] == 0).sum()]) for i in odd]).tolist() if odd else []
    special = dict(zip(odd, counts))
    for i, (nans, infs, _) in special.items():
        f = figures[i]
        if not nans and not infs and not (math.isfinite(f[0]) and math.isfinite(f[3]) and math.isfinite(f[5])):
            wide = computed[i][2].to(_F64)
            f[0], f[3], f[5] = wide.sum().item(), wide.abs().sum().item(), torch.dot(wide, wide).item()
    rows = []
    for step, vector in zip(steps, vectors):
        if isinstance(vector, list):
            numel, stats = vector[0], list(vector[1:])
            if step.tensor.value is None:
                numel = math.prod(step.tensor.shape) if step.tensor.shape else 1
        else:
            numel = vector[0]
            position = slot[id(vector)]
            total, low, high, abs_sum, _, squares = figures[position]
            nans, infs, zeros = special.get(position, (0, 0, 0))
            if nans:  # torch's min, max and mean propagate NaN; aminmax does too, the sum as well
                low = high = _NAN
            l2 = math.sqrt(squares) if squares == squares and squares >= 0 else _NAN
            mean = total / numel
            if numel > 1:
                var = (squares - total * total / numel) / (numel - 1)
                std = math.sqrt(var) if var > 0 else (0.0 if var == var else _NAN)
            else:
                std = _NAN
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
