"""The per-step statistics a store writes: their Parquet schema, and how one input's steps become columns.

The columns are those of `traces.tables.tensor_statistics` (numel, mean, std, min, max, abs_sum,
l2, NaN and inf counts, fraction of zeros), computed the way a store can afford for every step of
thousands of inputs. A tensor held by several steps (a block's result is its last op's tensor) is
summarised once, and so is a tensor over the same contiguous elements as an earlier one (a view or a
reshape of it: same address, element count and dtype, so the same bytes and the same figures, bit for
bit). The distinct tensors of an input are summarised together, in their own dtype
(float16 and bfloat16 in float32, integers and booleans in float64, complex as magnitudes), never
in a float64 copy:

- tensors under `SMALL` elements are stacked by (dtype, shape) into one matrix per group, so a
  group of a hundred small tensors costs the few torch calls of one; larger tensors are reduced
  one by one, in place (their magnitudes go to one scratch buffer reused for the input);
- for each row (tensor), in the reduction kernels of torch: the sum, the max and the min (one
  `torch.aminmax` pass for a large tensor), the sum and the min of the magnitudes, and the 2-norm
  (`torch.linalg.vector_norm`); all the figures of an
  input are stacked and read back with one `tolist()`.

So each column is:

- `min`, `max`: torch's amin and amax (NaN when the tensor holds a NaN, as torch's min and max);
  exact.
- `n_nan`, `n_inf`: counted exactly, for a tensor whose sum, magnitude sum or norm is not finite
  (finite ones hold neither); 0 otherwise.
- `frac_zero`: zeros counted exactly for a tensor whose least magnitude is 0 (or that holds a NaN),
  over numel.
- `mean`: the sum in the tensor's dtype over numel; `abs_sum`: the magnitudes' sum in the tensor's
  dtype; `l2`: vector_norm in the tensor's dtype. For float32 these are within about 1e-6 relative of
  the float64 figures of `tensor_statistics` (the mean within about 1e-6 of the mean magnitude: a
  mean near zero, as a LayerNorm output's, has a small absolute error only).
- `std`: from the sums, `sqrt((l2**2 - sum**2 / n) / (n - 1))` in float64, which loses precision
  when the mean dwarfs the spread.
- a tensor whose sums overflow its dtype without holding NaN or inf (an attention mask of float32
  minima) has its sum, magnitude sum and norm redone in float64.

Measured against `tensor_statistics` (an independent float64 computation) in tests/store/test_writer.py.

Depends on torch, numpy and pyarrow (imported when a table is built); never on the runtime or views.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

import torch

__all__ = ["COLUMNS", "SMALL", "arrow_schema", "summarise", "step_rows", "rows_table", "StepColumns"]

_NAN = float("nan")
SMALL = 16384  # elements: tensors below this are stacked with those of their dtype and shape
# name, arrow type name (see arrow_schema)
COLUMNS = (("sample", "int64"), ("step", "int32"), ("container_id", "string"), ("slot_type", "string"),
           ("block_path", "string"), ("out_var", "string"), ("op_name", "string"), ("description", "string"),
           ("frame_depth", "int32"), ("shape", "list<int64>"), ("dtype", "string"), ("numel", "int64"),
           ("mean", "double"), ("std", "double"), ("min", "double"), ("max", "double"), ("abs_sum", "double"),
           ("l2", "double"), ("n_nan", "int64"), ("n_inf", "int64"), ("frac_zero", "double"), ("kept", "bool"),
           ("omitted", "string"))
_NAMES = [name for name, _ in COLUMNS]
_STAT_KEYS = ("mean", "std", "min", "max", "abs_sum", "l2", "n_nan", "n_inf", "frac_zero")
_F64 = torch.float64
_NATIVE = (torch.float32, torch.float64)


def arrow_schema() -> Any:
    import pyarrow as pa

    types = {"int64": pa.int64(), "int32": pa.int32(), "string": pa.string(), "double": pa.float64(),
             "bool": pa.bool_(), "list<int64>": pa.list_(pa.int64())}
    return pa.schema([(name, types[kind]) for name, kind in COLUMNS])


def _absent(value: Any) -> list:
    """The statistics of a value torch cannot summarise (None, sparse, meta): NaN, no counts."""
    return [_NAN, _NAN, _NAN, _NAN, _NAN, _NAN, None, None, _NAN]


def _prepared(value: torch.Tensor) -> torch.Tensor:
    data = value.detach() if value.requires_grad else value
    if data.is_complex():
        data = data.abs()
    if data.device.type != "cpu":
        data = data.to("cpu")
    if data.dtype not in _NATIVE:
        data = data.to(torch.float32 if data.is_floating_point() else _F64)
    return data


def _reduce(matrix: torch.Tensor, scratch: Any = None) -> torch.Tensor:
    """[6, rows] float64 of a [rows, n] matrix: sum, min, max, magnitude sum, least magnitude, 2-norm."""
    if scratch is not None:
        magnitude = torch.abs(matrix, out=scratch[:matrix.numel()].view(matrix.shape))
    else:
        magnitude = matrix.abs()
    return torch.stack([matrix.sum(1), matrix.amin(1), matrix.amax(1), magnitude.sum(1), magnitude.amin(1),
                        torch.linalg.vector_norm(matrix, dim=1)]).to(_F64)


def _reduce_one(tensor: torch.Tensor, scratch: torch.Tensor) -> torch.Tensor:
    """`_reduce` of one large tensor as one row: the same figures, its min and max from one `torch.aminmax`
    pass (on CPU, aminmax over a whole tensor reads it once; along a dimension it is several times slower
    than amin and amax, so the stacked groups keep those)."""
    flat = tensor.reshape(-1)
    magnitude = torch.abs(flat, out=scratch[:flat.numel()])
    low, high = torch.aminmax(flat)
    return torch.stack([flat.sum(), low, high, magnitude.sum(), magnitude.amin(),
                        torch.linalg.vector_norm(flat)]).to(_F64).unsqueeze(1)


def summarise(values: Sequence[Any]) -> list[list]:
    """The statistics `[mean, std, min, max, abs_sum, l2, n_nan, n_inf, frac_zero]` of each value (see the
    module docstring); values may repeat (a repeated object is summarised once) or not be tensors."""
    out: list = [None] * len(values)
    first: dict[int, int] = {}  # id of a tensor -> its first position
    alias: dict[tuple, int] = {}  # (address, numel, dtype) of a contiguous tensor -> its first position
    repeats: list[tuple[int, int]] = []
    groups: dict[tuple, list[int]] = {}
    large: list[int] = []
    data: list[Any] = [None] * len(values)
    tensor_type, strided, native = torch.Tensor, torch.strided, _NATIVE
    for i, value in enumerate(values):
        if not isinstance(value, tensor_type):
            out[i] = _absent(value)
            continue
        j = first.get(id(value))
        if j is not None:
            repeats.append((i, j))
            continue
        first[id(value)] = i
        if value.is_cpu and value.dtype in native and value.layout == strided and not value.requires_grad:
            tensor = value
            if value.is_contiguous() and value.numel():
                # another tensor object over the same elements (a view, a reshape): the same bytes, so the
                # same figures, bit for bit
                key = (value.data_ptr(), value.numel(), value.dtype)
                j = alias.get(key)
                if j is not None:
                    repeats.append((i, j))
                    continue
                alias[key] = i
        elif value.layout != strided or value.is_meta:
            out[i] = _absent(value)
            continue
        else:
            tensor = _prepared(value)
        numel = tensor.numel()
        if numel == 0:
            out[i] = [_NAN, _NAN, _NAN, _NAN, 0.0, 0.0, 0, 0, _NAN]
            continue
        data[i] = tensor
        if numel < SMALL:
            key = (tensor.dtype, tensor.shape)
            members = groups.get(key)
            if members is None:
                groups[key] = [i]
            else:
                members.append(i)
        else:
            large.append(i)
    order: list[int] = []
    parts: list[torch.Tensor] = []
    for members in groups.values():
        rows = torch.stack([data[i] for i in members]) if len(members) > 1 else data[members[0]].unsqueeze(0)
        parts.append(_reduce(rows.reshape(len(members), -1)))
        order.extend(members)
    if large:
        scratch: dict[torch.dtype, torch.Tensor] = {}
        for i in large:
            tensor = data[i]
            buffer = scratch.get(tensor.dtype)
            if buffer is None or buffer.numel() < tensor.numel():
                buffer = scratch[tensor.dtype] = torch.empty(max(data[k].numel() for k in large if
                                                                 data[k].dtype == tensor.dtype), dtype=tensor.dtype)
            parts.append(_reduce_one(tensor, buffer))
            order.append(i)
    if parts:
        f = torch.cat(parts, 1)  # [6, tensors]: sum, min, max, magnitude sum, least magnitude, 2-norm
        numel = torch.tensor([data[i].numel() for i in order], dtype=_F64)
        total, l2 = f[0], f[5]
        var = (l2 * l2 - total * total / numel) / (numel - 1)
        std = torch.where(var > 0, var.clamp(min=0).sqrt(), torch.where(var == var, 0.0, _NAN))
        std = torch.where(numel > 1, std, _NAN)
        table = torch.stack([total / numel, std, f[1], f[2], f[3], l2]).t().tolist()
        odd = set(((~(total.isfinite() & f[3].isfinite() & l2.isfinite())) | (f[4] == 0)).nonzero().flatten().tolist())
        for position, (i, row) in enumerate(zip(order, table)):
            out[i] = row + [0, 0, 0.0] if position not in odd else _odd(data[i], f[:, position].tolist())
    for i, j in repeats:
        out[i] = out[j]
    return out


def _odd(tensor: torch.Tensor, figures: list) -> list:
    """The row of a tensor with NaN or inf, with sums that overflow its dtype, or with zeros: counted exactly."""
    numel = tensor.numel()
    total, low, high, abs_sum, least, l2 = figures
    nans = infs = zeros = 0
    if not (math.isfinite(total) and math.isfinite(abs_sum) and math.isfinite(l2)):
        # NaN or inf, or sums that overflow the dtype (an attention mask of float32 minima): count,
        # and redo the sums in float64 where nothing but the overflow made them infinite
        nans, infs = int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())
        if not nans and not infs:
            wide = tensor.to(_F64)
            total, abs_sum, l2 = wide.sum().item(), wide.abs().sum().item(), torch.linalg.vector_norm(wide).item()
    if least == 0 or nans:  # a NaN hides the least magnitude
        zeros = int((tensor == 0).sum())
    if nans:  # torch's min, max and mean propagate NaN
        low = high = _NAN
    mean = total / numel
    if numel > 1:
        var = (l2 * l2 - total * total / numel) / (numel - 1)
        std = math.sqrt(var) if var > 0 else (0.0 if var == var else _NAN)
    else:
        std = _NAN
    return [mean, std, low, high, abs_sum, l2, nans, infs, zeros / numel]


# The columns an input's steps repeat from the one before when the schema runs the same way (numbers, names,
# descriptions, depths, shapes, dtypes, omissions): each is kept as a list of per-input chunks, and a chunk
# object seen again (the writer hands the same list on: writer.py, `_Names.steady`) is made an Arrow
# array once, then the chunks are concatenated.
_CHUNKED = frozenset((1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 22))


class StepColumns:
    """The statistics rows of a unit, kept as columns (COLUMNS order) and made one Arrow table at the end.

    `columns[k]` is a flat list, or for k in `_CHUNKED` a list of per-input lists (`flat(k)` joins them)."""

    def __init__(self) -> None:
        self.columns: list[list] = [[] for _ in COLUMNS]
        self.rows = 0

    def __len__(self) -> int:
        return self.rows

    def flat(self, k: int) -> list:
        column = self.columns[k]
        return [x for chunk in column for x in chunk] if k in _CHUNKED else column

    def add(self, sample: int, numbers: list, cids: list, slot_types: list, block_paths: list, out_vars: list,
            op_names: list, descriptions: list, depths: list, shapes: list, dtypes: list, values: list,
            kept: list, omitted: list) -> list[list]:
        """Append one input's steps (parallel lists, kept as they are: not to be changed afterwards); returns
        their statistics (summarise's lists)."""
        stats = summarise(values)
        c = self.columns
        n = len(numbers)
        self.rows += n
        c[0].extend([sample] * n)
        for k, column in enumerate((numbers, cids, slot_types, block_paths, out_vars, op_names, descriptions,
                                    depths, shapes, dtypes), 1):
            c[k].append(column)
        numels = [v.numel() if isinstance(v, torch.Tensor) else (math.prod(s) if s else 1) if v is None else 0
                  for v, s in zip(values, shapes)]
        c[11].extend(numels)
        for k, column in enumerate(zip(*stats), 12) if stats else ():
            c[k].extend(column)
        c[21].extend(kept)
        c[22].append(omitted)
        return stats

    def table(self) -> Any:
        import pyarrow as pa

        schema = arrow_schema()
        arrays = []
        for k, (column, field) in enumerate(zip(self.columns, schema)):
            if k not in _CHUNKED:
                arrays.append(pa.array(column, type=field.type))
                continue
            made: dict[int, Any] = {}
            chunks = []
            for chunk in column:
                array = made.get(id(chunk))
                if array is None:
                    array = made[id(chunk)] = _shape_array(chunk) if k == 9 else pa.array(chunk, type=field.type)
                chunks.append(array)
            arrays.append(chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks) if chunks else
                          pa.array([], type=field.type))
        return pa.Table.from_arrays(arrays, schema=schema)


def _shape_array(shapes: list) -> Any:
    import numpy as np
    import pyarrow as pa

    lengths = np.fromiter((len(s) for s in shapes), dtype=np.int32, count=len(shapes))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.fromiter((int(d) for s in shapes for d in s), dtype=np.int64, count=int(offsets[-1]))
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))


def step_rows(sample: int, steps: Iterable[Any], kept: set[int]) -> list[tuple]:
    """One row (COLUMNS order) per TraceStep of an input; `kept`: the step numbers whose tensor is written."""
    steps = list(steps)
    columns = StepColumns()
    columns.add(sample, [s.step for s in steps], [s.container_id for s in steps], [s.slot_type for s in steps],
                [s.block_path for s in steps], [s.out_var for s in steps], [s.op_name for s in steps],
                [s.description for s in steps], [s.frame_depth for s in steps],
                [tuple(int(d) for d in s.tensor.shape) for s in steps], [str(s.tensor.dtype) for s in steps],
                [s.tensor.value for s in steps], [s.step in kept for s in steps], [s.omitted for s in steps])
    c = [columns.flat(k) for k in range(len(COLUMNS))]
    c[9] = [list(s) for s in c[9]]
    return list(zip(*c))


def rows_table(rows: list[tuple]) -> Any:
    """The pyarrow Table of `rows` (COLUMNS order)."""
    columns = StepColumns()
    if rows:
        columns.columns = [[list(col)] if k in _CHUNKED else list(col) for k, col in enumerate(zip(*rows))]
        columns.columns[9] = [[tuple(s) for s in columns.columns[9][0]]]
        columns.rows = len(rows)
    return columns.table()
