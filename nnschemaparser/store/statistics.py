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
import operator
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np
import torch

__all__ = ["COLUMNS", "SMALL", "arrow_schema", "summarise", "Summariser", "Figures", "step_rows", "StepColumns"]

_NAN = float("nan")
SMALL = 16384  # elements: tensors below this are stacked with those of their dtype and shape
GROUP = 10000000  # elements: the most stacked at once (256 KiB of float32)
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
    flat = tensor.reshape(-1)  # a view when it is flat already
    magnitude = torch.abs(flat, out=scratch[:flat.numel()])
    low, high = torch.aminmax(flat)
    return torch.stack([flat.sum(), low, high, magnitude.sum(), magnitude.amin(),
                        torch.linalg.vector_norm(flat)]).to(_F64).unsqueeze(1)


def _getter(positions: Sequence[int]) -> Callable[[Sequence[Any]], tuple]:
    """A C-level `lambda seq: tuple(seq[i] for i in positions)`."""
    if not positions:
        return lambda seq: ()
    if len(positions) == 1:
        only = positions[0]
        return lambda seq: (seq[only],)
    return operator.itemgetter(*positions)


_TYPE_OF, _ID_OF = type, id
_DTYPE_OF = torch.Tensor.dtype.__get__
_GRAD_OF = torch.Tensor.requires_grad.__get__
_CPU_OF = torch.Tensor.is_cpu.__get__
_LAYOUT_OF = torch.Tensor.layout.__get__
_NUMEL_OF = torch.Tensor.numel
_CONTIGUOUS_OF = torch.Tensor.is_contiguous
_PTR_OF = torch.Tensor.data_ptr


def _alias_firsts(positions: Sequence[int], ptrs: list, numels: list, dtypes: list, contiguous: list) -> list[int]:
    """For each native position, the first one over the same contiguous elements (address, element count,
    dtype), or itself."""
    seen: dict[tuple, int] = {}
    return [seen.setdefault((p, m, d), i) if c and m else i
            for i, p, m, d, c in zip(positions, ptrs, numels, dtypes, contiguous)]


class _Plan:
    """What `summarise` decides for each value of one input, kept so that the next input whose values fall
    the same way is summarised without deciding again.

    The decisions, for each value in order: not a tensor, or one torch cannot summarise (sparse, meta)
    -> absent; the same object as an earlier value, or (a CPU float32/float64 strided tensor without
    grad, contiguous) over the same elements as an earlier one -> that one's figures; empty -> the
    empty figures; otherwise reduced, as it is or converted first (`_prepared`), in the stacked group
    of its dtype and shape (under SMALL elements) or alone. `matches` checks, with C-level passes over
    the values (types, object identities, dtypes, grad flags, devices, layouts, element counts,
    addresses and contiguity), that the same decisions hold for other values; the shapes of what is
    reduced are checked as it is stacked (`figures` gives None when they moved), so a plan reused gives what a
    plan made afresh gives, bit for bit.
    """

    def __init__(self, values: Sequence[Any]):
        n = len(values)
        self.n = n
        self.types = list(map(_TYPE_OF, values))
        tensor_type = torch.Tensor
        tensors = [i for i, t in enumerate(self.types) if issubclass(t, tensor_type)]
        self.tensors, self.take_tensors = tensors, _getter(tensors)
        self.reversed_tensors = tensors[::-1]
        first: dict[int, int] = {}
        self.firsts = [first.setdefault(id(values[i]), i) for i in tensors]
        distinct = [i for i, j in zip(tensors, self.firsts) if i == j]
        self.take_distinct = _getter(distinct)
        dv = self.take_distinct(values)
        self.dtypes = list(map(_DTYPE_OF, dv))
        self.grads = list(map(_GRAD_OF, dv))
        self.cpus = list(map(_CPU_OF, dv))
        self.layouts = list(map(_LAYOUT_OF, dv))
        others = [i for i, cpu in zip(distinct, self.cpus) if not cpu]
        self.take_others = _getter(others)
        self.metas = [values[i].is_meta for i in others]
        strided = torch.strided
        native = [i for i, d, g, c, lay in zip(distinct, self.dtypes, self.grads, self.cpus, self.layouts)
                  if c and d in _NATIVE and lay == strided and not g]
        self.native, self.take_native = native, _getter(native)
        nv = self.take_native(values)
        self.native_numels = list(map(_NUMEL_OF, nv))
        self.native_dtypes = [values[i].dtype for i in native]
        self.aliases = _alias_firsts(native, list(map(_PTR_OF, nv)), self.native_numels, self.native_dtypes,
                                     list(map(_CONTIGUOUS_OF, nv)))
        is_native, is_tensor = set(native), set(tensors)
        absent = {i for i in range(n) if i not in is_tensor}
        meta = dict(zip(others, self.metas))
        self.prepared = [i for i, lay in zip(distinct, self.layouts)
                         if i not in is_native and lay == strided and not meta.get(i, False)]
        is_prepared = set(self.prepared)
        absent.update(i for i in distinct if i not in is_native and i not in is_prepared)
        self.absent_tensors = [i for i in distinct if i in absent]
        # what is reduced: native values that are their own alias, and prepared ones; grouped as summarise did
        alias_of = dict(zip(native, self.aliases))
        numel_of = dict(zip(native, self.native_numels))
        data = list(values)
        for i in self.prepared:
            data[i] = _prepared(values[i])
            numel_of[i] = data[i].numel()
        empty: list[int] = []
        groups: dict[tuple, list[int]] = {}
        large: list[int] = []
        for i in distinct:
            if i in absent or alias_of.get(i, i) != i:
                continue
            if numel_of[i] == 0:
                empty.append(i)
            elif numel_of[i] < SMALL:
                groups.setdefault((data[i].dtype, tuple(data[i].shape)), []).append(i)
            else:
                large.append(i)
        self.empty = empty
        self.groups = [(_getter(members), len(members), dtype, shape) for (dtype, shape), members in groups.items()]
        self.large = [(i, data[i].dtype, tuple(data[i].shape)) for i in large]
        order = [i for members in groups.values() for i in members] + large
        self.rows = len(order)
        self.numel = torch.tensor([numel_of[i] for i in order], dtype=_F64)
        # where each value's figures come from: a reduced row, the absent row, or the empty row
        absent_row, empty_row = self.rows, self.rows + 1
        source = [absent_row] * n
        for row, i in enumerate(order):
            source[i] = row
        for i in empty:
            source[i] = empty_row
        for i, j in zip(native, self.aliases):
            if j != i:
                source[i] = source[j]
        for i, j in zip(tensors, self.firsts):
            if j != i:
                source[i] = source[j]
        self.source = np.asarray(source, dtype=np.int64)
        self.counted = self.source != absent_row
        numels = np.full(n, -1, dtype=np.int64)
        numels[native] = self.native_numels
        self.numels = numels
        self.fill_numels = [i for i in distinct if i not in is_native]  # counted each time: prepared, absent
        self.repeats = np.asarray([(i, j) for i, j in zip(tensors, self.firsts) if j != i], dtype=np.int64).reshape(-1, 2)
        numels[self.repeats[:, 0]] = numels[self.repeats[:, 1]]

    def matches(self, values: Sequence[Any]) -> bool:
        """Whether `values` fall the way this plan's did (the shapes of what is reduced aside)."""
        if len(values) != self.n or list(map(_TYPE_OF, values)) != self.types:
            return False
        ids = list(map(_ID_OF, self.take_tensors(values)))
        first = dict(zip(reversed(ids), self.reversed_tensors))
        if list(map(first.__getitem__, ids)) != self.firsts:
            return False
        dv = self.take_distinct(values)
        if (list(map(_DTYPE_OF, dv)) != self.dtypes or list(map(_GRAD_OF, dv)) != self.grads
                or list(map(_CPU_OF, dv)) != self.cpus or list(map(_LAYOUT_OF, dv)) != self.layouts):
            return False
        if self.metas and [v.is_meta for v in self.take_others(values)] != self.metas:
            return False
        nv = self.take_native(values)
        numels = list(map(_NUMEL_OF, nv))
        if numels != self.native_numels:
            return False
        return _alias_firsts(self.native, list(map(_PTR_OF, nv)), numels, self.native_dtypes,
                             list(map(_CONTIGUOUS_OF, nv))) == self.aliases

    def figures(self, values: Sequence[Any]) -> Optional["Figures"]:
        """The statistics of `values` (which `matches` this plan); None when what is reduced changed shape or
        place (the values need a plan of their own)."""
        data = list(values)
        for i in self.prepared:
            data[i] = _prepared(values[i])
        parts: list[torch.Tensor] = []
        matrices: list[torch.Tensor] = []
        strided = torch.strided
        for take, count, dtype, shape in self.groups:
            members = take(data)
            try:
                rows = torch.stack(members) if count > 1 else members[0].unsqueeze(0)
            except RuntimeError:  # shapes or devices no longer alike
                return None
            if rows.dtype != dtype or rows.shape[1:] != shape or not rows.is_cpu or rows.layout != strided:
                return None
            matrix = rows.reshape(count, -1)
            matrices.append(matrix)
            parts.append(_reduce(matrix))
        if self.large:
            scratch: dict[torch.dtype, torch.Tensor] = {}
            for i, dtype, shape in self.large:
                tensor = data[i]
                if tensor.dtype != dtype or tensor.shape != shape or not tensor.is_cpu or tensor.layout != strided:
                    return None
                buffer = scratch.get(dtype)
                if buffer is None or buffer.numel() < tensor.numel():
                    buffer = scratch[dtype] = torch.empty(max(math.prod(s) for _, d, s in self.large if d == dtype),
                                                          dtype=dtype)
                matrices.append(tensor.unsqueeze(0))  # a view: a flat copy held here would cost fresh pages
                parts.append(_reduce_one(tensor, buffer))
        for i in self.empty:
            if data[i].numel() != 0:
                return None
        table = _finish(parts, matrices, self.numel) if parts else np.empty((0, 9))
        table = np.concatenate([table, _CONSTANT_ROWS])[self.source]
        numels = self.numels
        if self.fill_numels:
            numels = numels.copy()
            numels[self.fill_numels] = [values[i].numel() for i in self.fill_numels]
            numels[self.repeats[:, 0]] = numels[self.repeats[:, 1]]
        return Figures(table, self.counted, numels)


# the figures of a value torch cannot summarise (None, sparse, meta: no counts), and of an empty tensor
_CONSTANT_ROWS = np.array([[_NAN] * 9, [_NAN, _NAN, _NAN, _NAN, 0.0, 0.0, 0.0, 0.0, _NAN]])


def _finish(parts: list[torch.Tensor], matrices: list[torch.Tensor], numel: torch.Tensor) -> np.ndarray:
    """[rows, 9] float64 (mean, std, min, max, abs_sum, l2, n_nan, n_inf, frac_zero) of the reduced rows.

    A row holds no NaN or inf when its sums are finite, and no zero when its least magnitude is not 0:
    only the other rows are counted (`_count_zeros`, `_unfinished_rows`)."""
    f = torch.cat(parts, 1)  # [6, rows]: sum, min, max, magnitude sum, least magnitude, 2-norm
    total, low, high, abs_sum, least, l2 = f
    var = (l2 * l2 - total * total / numel) / (numel - 1)
    std = torch.where(var > 0, var.clamp(min=0).sqrt(), torch.where(var == var, 0.0, _NAN))
    std = torch.where(numel > 1, std, _NAN)
    none = torch.zeros_like(total)
    table = torch.stack([total / numel, std, low, high, abs_sum, l2, none, none, none], 1).numpy()
    finite = total.isfinite() & abs_sum.isfinite() & l2.isfinite()
    zeros = (finite & (least == 0)).nonzero().flatten()
    if zeros.numel():
        _count_zeros(table, zeros.tolist(), matrices)
    unfinished = (~finite).nonzero().flatten()
    if unfinished.numel():
        _unfinished_rows(table, unfinished.tolist(), f.index_select(1, unfinished).t().tolist(), matrices)
    return table


def _locate(rows: list[int], matrices: list[torch.Tensor]) -> dict[int, list[tuple[int, int]]]:
    """{matrix index: [(row, its row in that matrix)]} of sorted reduced rows (a matrix: a stacked group, or a
    large tensor with a leading dimension of 1)."""
    bounds = np.cumsum([m.shape[0] for m in matrices]).tolist()
    found: dict[int, list[tuple[int, int]]] = {}
    which = 0
    for row in rows:
        while row >= bounds[which]:
            which += 1
        found.setdefault(which, []).append((row, row - (bounds[which - 1] if which else 0)))
    return found


def _count_zeros(table: np.ndarray, rows: list[int], matrices: list[torch.Tensor]) -> None:
    """frac_zero of rows with finite sums whose least magnitude is 0, counted exactly (per matrix, one pass
    over those rows)."""
    for which, places in _locate(rows, matrices).items():
        matrix = matrices[which]
        local = torch.tensor([r for _, r in places])
        counts = (matrix.index_select(0, local) == 0).reshape(len(places), -1).sum(1).numpy()
        table[[row for row, _ in places], 8] = counts / matrix[0].numel()


def _unfinished_rows(table: np.ndarray, rows: list[int], figures: list[list], matrices: list[torch.Tensor]) -> None:
    """Rows whose sums are not finite: they hold NaN or inf (counted exactly, and zeros with them), or their
    sums overflow the dtype (an attention mask of float32 minima) and are redone in float64."""
    located = {row: (which, r) for which, places in _locate(rows, matrices).items() for row, r in places}
    for row, (total, low, high, abs_sum, _, l2) in zip(rows, figures):
        which, r = located[row]
        data = matrices[which][r]
        numel = data.numel()
        nans, infs, zeros = int(torch.isnan(data).sum()), int(torch.isinf(data).sum()), int((data == 0).sum())
        if not nans and not infs:  # nothing but the overflow made the sums infinite
            wide = data.to(_F64)
            total, abs_sum, l2 = wide.sum().item(), wide.abs().sum().item(), torch.linalg.vector_norm(wide).item()
        if nans:  # torch's min, max and mean propagate NaN
            low = high = _NAN
        if numel > 1:
            var = (l2 * l2 - total * total / numel) / (numel - 1)
            std = math.sqrt(var) if var > 0 else (0.0 if var == var else _NAN)
        else:
            std = _NAN
        table[row] = (total / numel, std, low, high, abs_sum, l2, nans, infs, zeros / numel)


class Figures:
    """The statistics of an input's values as columns: `table` float64 [values, 9] (mean, std, min, max, abs_sum,
    l2, n_nan, n_inf, frac_zero), `counted` (False where the counts are missing: a value torch cannot
    summarise), `numels` int64 (-1 for a value that is not a tensor)."""

    __slots__ = ("table", "counted", "numels")

    def __init__(self, table: np.ndarray, counted: np.ndarray, numels: np.ndarray):
        self.table, self.counted, self.numels = table, counted, numels

    def __len__(self) -> int:
        return len(self.table)

    def l2(self, i: int) -> float:
        return float(self.table[i, 5])

    def rows(self) -> list[list]:
        """One list `[mean, std, min, max, abs_sum, l2, n_nan, n_inf, frac_zero]` per value (counts as ints or None)."""
        out = self.table.tolist()
        for row, counted in zip(out, self.counted.tolist()):
            if counted:
                row[6], row[7] = int(row[6]), int(row[7])
            else:
                row[6] = row[7] = None
        return out


class Summariser:
    """`summarise` for a run of inputs: the plan of the last input is reused while the next one's values
    fall the same way (`_Plan.matches`), which a schema run the same way on each input does; the
    figures are those a fresh plan gives, bit for bit."""

    def __init__(self) -> None:
        self.plan: Optional[_Plan] = None

    def __call__(self, values: Sequence[Any]) -> Figures:
        plan = self.plan
        if plan is not None and plan.matches(values):
            figures = plan.figures(values)
            if figures is not None:
                return figures
        plan = self.plan = _Plan(values)
        figures = plan.figures(values)
        if figures is None:  # pragma: no cover - a plan fits the values it was made from
            raise RuntimeError("store statistics: a fresh plan does not fit its own values (a bug: please report it)")
        return figures


def summarise(values: Sequence[Any]) -> list[list]:
    """The statistics `[mean, std, min, max, abs_sum, l2, n_nan, n_inf, frac_zero]` of each value (see the
    module docstring); values may repeat (a repeated object is summarised once) or not be tensors."""
    return Summariser()(values).rows()


# The columns an input's steps repeat from the one before when the schema runs the same way (numbers, names,
# descriptions, depths, shapes, dtypes, omissions): each is kept as a list of per-input chunks, and a chunk
# object seen again (the writer hands the same list on: writer.py, `_Names.steady`) is made an Arrow
# array once, then the chunks are concatenated.
_CHUNKED = frozenset((1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 22))


class StepColumns:
    """The statistics rows of a unit, kept as columns (COLUMNS order) and made one Arrow table at the end.

    The columns in `_CHUNKED` are lists of per-input lists; the sample, numel, statistics and kept columns
    are per-input NumPy chunks (a Figures table holds the nine statistics of an input)."""

    def __init__(self) -> None:
        self.columns: dict[int, list] = {k: [] for k in _CHUNKED}
        self.samples: list[tuple[int, int]] = []  # (sample, steps)
        self.numels: list[np.ndarray] = []
        self.figures: list[Figures] = []
        self.kept: list[np.ndarray] = []
        self.rows = 0

    def __len__(self) -> int:
        return self.rows

    def flat(self, k: int) -> list:
        """Column k as one Python list."""
        if k in _CHUNKED:
            return [x for chunk in self.columns[k] for x in chunk]
        if k == 0:
            return [s for s, n in self.samples for _ in range(n)]
        if k == 11:
            return np.concatenate(self.numels).tolist() if self.numels else []
        if k == 21:
            return np.concatenate(self.kept).tolist() if self.kept else []
        rows = [row for f in self.figures for row in f.rows()]
        return [row[k - 12] for row in rows]

    def add(self, sample: int, numbers: list, cids: list, slot_types: list, block_paths: list, out_vars: list,
            op_names: list, descriptions: list, depths: list, shapes: list, dtypes: list, values: list,
            kept: Any, omitted: list, figures: Optional[Figures] = None) -> Figures:
        """Append one input's steps (parallel lists, kept as they are: not to be changed afterwards) and their
        statistics (`figures` of `values`, computed here when not given); returns the figures."""
        if figures is None:
            figures = Summariser()(values)
        c = self.columns
        n = len(numbers)
        self.rows += n
        self.samples.append((sample, n))
        for k, column in zip((1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 22), (numbers, cids, slot_types, block_paths, out_vars,
                                                                   op_names, descriptions, depths, shapes, dtypes,
                                                                   omitted)):
            c[k].append(column)
        numels = figures.numels
        missing = np.flatnonzero(numels < 0)
        if len(missing):  # not a tensor: a value dropped (None) counts its recorded shape's elements
            numels = numels.copy()
            for i in missing.tolist():
                s = shapes[i]
                numels[i] = (math.prod(s) if s else 1) if values[i] is None else 0
        self.numels.append(numels)
        self.figures.append(figures)
        self.kept.append(np.asarray(kept, dtype=bool))
        return figures

    def table(self) -> Any:
        import pyarrow as pa

        schema = arrow_schema()
        arrays: list[Any] = [None] * len(COLUMNS)
        for k in _CHUNKED:
            field = schema[k]
            made: dict[int, Any] = {}
            chunks = []
            for chunk in self.columns[k]:
                array = made.get(id(chunk))
                if array is None:
                    array = made[id(chunk)] = _shape_array(chunk) if k == 9 else pa.array(chunk, type=field.type)
                chunks.append(array)
            arrays[k] = (chunks[0] if len(chunks) == 1 else pa.concat_arrays(chunks) if chunks else
                         pa.array([], type=field.type))
        arrays[0] = pa.array(np.repeat(np.array([s for s, _ in self.samples], dtype=np.int64),
                                       [n for _, n in self.samples]) if self.samples else np.zeros(0, np.int64))
        arrays[11] = pa.array(np.concatenate(self.numels) if self.numels else np.zeros(0, np.int64))
        table = np.concatenate([f.table for f in self.figures]) if self.figures else np.zeros((0, 9))
        counted = np.concatenate([f.counted for f in self.figures]) if self.figures else np.zeros(0, bool)
        for j, k in enumerate(range(12, 21)):
            column = np.ascontiguousarray(table[:, j])
            if k in (18, 19):  # n_nan, n_inf: missing where the value could not be summarised
                arrays[k] = pa.array(np.where(counted, column, 0).astype(np.int64), mask=~counted)
            else:
                arrays[k] = pa.array(column)
        arrays[21] = pa.array(np.concatenate(self.kept) if self.kept else np.zeros(0, bool))
        return pa.Table.from_arrays(arrays, schema=schema)


def _shape_array(shapes: list) -> Any:
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
