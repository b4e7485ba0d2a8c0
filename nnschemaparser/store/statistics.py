"""The per-step statistics a store writes: how an input's values are summarised (their table of columns
is step_table.py).

The columns are those of `traces.tables.tensor_statistics` (numel, mean, std, min, max, abs_sum,
l2, NaN and inf counts, fraction of zeros), computed the way a store can afford for every step of
thousands of inputs. A tensor held by several steps (a block's result is its last op's tensor) is
summarised once, and so is a tensor over the same contiguous elements as an earlier one (a view or a
reshape of it: same address, element count and dtype, so the same bytes and the same figures, bit for
bit). The distinct tensors of an input are summarised together, float32 and float64 as they are
(float16 and bfloat16 in float32, integers and booleans in float64, complex as magnitudes).

Two engines compute the figures; a `Summariser` names its own in `engine`, and each commit of a
store records the one it was written with:

"native-2", where this process could build the C kernel (native.py; the default): each tensor is
read once, and the sum, the magnitude sum and the sum of squares are float64 sums in the order
`_statistics.c` fixes, so they are the same on every machine that builds it; min, max and the
counts are exact (min, max and mean NaN where the tensor holds a NaN); `mean` = sum / numel, `l2` = sqrt(sum of squares), `std` =
`sqrt((squares - sum**2 / n) / (n - 1))` (which loses precision when the mean dwarfs the spread).

"torch", without a compiler or with `NNSCHEMAPARSER_NATIVE=0`: torch's reduction kernels, in the
tensor's dtype, never in a float64 copy:

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

Depends on torch and numpy (and native.py, torch_figures.py: the "torch" engine's reductions); never on the runtime or views.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from . import native
from .native import ENGINE
from .torch_figures import finish, reduce_one, reduce_rows

__all__ = ["SMALL", "summarise", "Summariser", "Figures", "ColumnReads"]

_NAN = float("nan")
SMALL = 16384  # elements: tensors below this are stacked with those of their dtype and shape
GROUP = 10000000  # elements: the most stacked at once (256 KiB of float32)
_KEYS = 64  # kinds of input (`Summariser.__call__`'s key) whose last plans a summariser keeps
_F64 = torch.float64
_NATIVE = (torch.float32, torch.float64)
_NARROW = {torch.float16: native.KINDS[torch.float16], torch.bfloat16: native.KINDS[torch.bfloat16]}


def _prepared(value: torch.Tensor) -> torch.Tensor:
    data = value.detach() if value.requires_grad else value
    if data.is_complex():
        data = data.abs()
    elif data.is_neg():  # a negated view (the imaginary part of a conjugate): its values, not its memory
        data = data.resolve_neg()
    if data.device.type != "cpu":
        data = data.to("cpu")
    if data.dtype not in _NATIVE:
        data = data.to(torch.float32 if data.is_floating_point() else _F64)
    return data


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
_SHAPE_OF = torch.Tensor.size  # the torch.Size `.shape` gives, read faster (bench/bench_tensor_reads.py)
_STRIDE_OF = torch.Tensor.stride
_NEG_OF = torch.Tensor.is_neg


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
    grad, not a negated view, contiguous) over the same elements as an earlier one -> that one's
    figures; empty -> the empty figures; otherwise reduced, as it is or converted first (`_prepared`;
    the kernel reads a CPU float16 or bfloat16 tensor as it lies instead), in the stacked group of its
    dtype and shape (under SMALL elements) or alone. `matches` checks, with C-level passes over
    the values (types, object identities, dtypes, grad flags, devices, layouts, element counts or the
    caller's shapes, addresses and contiguity), that the same decisions hold for other values; the shapes of what is
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
        first: dict[int, int] = {}
        self.firsts = [first.setdefault(id(values[i]), i) for i in tensors]
        distinct = [i for i, j in zip(tensors, self.firsts) if i == j]
        # what `matches` checks of the objects: each repeat is its first's object, and there are as many
        # distinct objects as firsts (so no two firsts are one object): together, `firsts` again
        place = {i: k for k, i in enumerate(tensors)}
        repeated = [(place[i], place[j]) for i, j in zip(tensors, self.firsts) if i != j]
        self.repeats_of = (_getter([a for a, _ in repeated]), _getter([b for _, b in repeated])) if repeated else None
        self.distinct_count = len(distinct)
        self.take_distinct = _getter(distinct)
        dv = self.take_distinct(values)
        self.dtypes = list(map(_DTYPE_OF, dv))
        self.grads = list(map(_GRAD_OF, dv))
        self.any_grad = any(self.grads)
        self.cpus = list(map(_CPU_OF, dv))
        self.layouts = list(map(_LAYOUT_OF, dv))
        others = [i for i, cpu in zip(distinct, self.cpus) if not cpu]
        self.take_others = _getter(others)
        self.metas = [values[i].is_meta for i in others]
        strided = torch.strided
        native = [i for i, d, g, c, lay in zip(distinct, self.dtypes, self.grads, self.cpus, self.layouts)
                  if c and d in _NATIVE and lay == strided and not g and not values[i].is_neg()]
        self.native, self.take_native = native, _getter(native)
        in_native = set(native)
        unread = [i for i in distinct if i not in in_native]  # whose layouts `matches` reads (few)
        self.take_unread = _getter(unread)
        self.others_layouts = [values[i].layout for i in unread]
        nv = self.take_native(values)
        self.native_numels = list(map(_NUMEL_OF, nv))
        self.native_dtypes = [values[i].dtype for i in native]
        self.native_contiguous = list(map(_CONTIGUOUS_OF, nv))
        try:  # what `matches` compares with the caller's shapes (a nested tensor has none: its counts are read)
            self.native_shapes: Optional[list] = list(map(_SHAPE_OF, nv))
        except (RuntimeError, TypeError):
            self.native_shapes = None
        ptrs = list(map(_PTR_OF, nv))
        self.aliases = _alias_firsts(native, ptrs, self.native_numels, self.native_dtypes, self.native_contiguous)
        # the addresses of the values last checked (here or by `matches`), which the kernel reads: (values, ptrs,
        # the caller's shapes of the values or None)
        self._checked: Optional[tuple] = (values, np.fromiter(ptrs, np.int64, len(ptrs)), None)
        # what `matches` checks of the addresses (the element counts, dtypes and contiguity being the plan's):
        # each alias at its first's address, and the firsts that could be aliased at distinct (address, count,
        # dtype) keys; together that is `_alias_firsts` giving `aliases` again
        where = {i: k for k, i in enumerate(native)}
        pairs = [(k, where[j]) for k, (i, j) in enumerate(zip(native, self.aliases)) if i != j]
        self.aliases_of = (_getter([a for a, _ in pairs]), _getter([b for _, b in pairs])) if pairs else None
        keyed = [k for k, (i, j, c, m) in enumerate(zip(native, self.aliases, self.native_contiguous,
                                                        self.native_numels)) if i == j and c and m]
        self.take_keyed = _getter(keyed)
        self.keyed_numels = [self.native_numels[k] for k in keyed]
        self.keyed_dtypes = [self.native_dtypes[k] for k in keyed]
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
        # the kernel's view of the same rows (native.py), by dtype: the rows, their element counts, where the
        # native members' addresses are among `native`'s, and in member order those read otherwise: a native
        # view (not contiguous: its sizes and strides are read each time) or a value converted first
        self.by_dtype = []
        contiguous_of = dict(zip(native, self.native_contiguous))
        cpu_of = dict(zip(distinct, self.cpus))
        narrow = {i: _NARROW[values[i].dtype] for i in self.prepared if cpu_of[i] and values[i].dtype in _NARROW}
        for dtype in _NATIVE:
            rows = [row for row, i in enumerate(order) if data[i].dtype == dtype]
            if rows:
                members = [order[row] for row in rows]
                own = [j for j, i in enumerate(members) if i in is_native]
                # (position, value, converted first, what the kernel reads there: native.KINDS's code of a
                # float16 or bfloat16 CPU tensor read as it lies, widened in the C code; else 0)
                irregular = [(j, i, i in is_prepared, narrow.get(i, 0)) for j, i in enumerate(members)
                             if i in is_prepared or not contiguous_of[i]]
                self.by_dtype.append((dtype, np.asarray(rows, dtype=np.int64),
                                      np.asarray([numel_of[i] for i in members], dtype=np.int64),
                                      np.asarray(own, dtype=np.int64),
                                      np.asarray([where[members[j]] for j in own], dtype=np.int64), irregular))
        # the groups whose irregular members are all native views: their sizes and strides are read with `map`, and
        # the kernel's arrays of them made again only when they differ from the last input's
        self.views = [(_getter([i for _, i, _, _ in irregular]), np.asarray([j for j, _, _, _ in irregular],
                                                                             dtype=np.int64))
                      if irregular and not any(p for _, _, p, _ in irregular) else None
                      for _, _, _, _, _, irregular in self.by_dtype]
        self._view_arrays: list = [None] * len(self.by_dtype)  # per group: (shapes, strides, ndims, sizes, strides)
        self.prepared_empty = [i for i in empty if i in is_prepared]
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

    def matches(self, values: Sequence[Any], dtypes: Optional[Sequence[Any]] = None,
                shapes: Optional[Sequence[Any]] = None) -> bool:
        """Whether `values` fall the way this plan's did (the shapes of what is reduced aside). `dtypes`: each
        value's dtype where it is a tensor, read by the caller, none of the values requiring grad (`Summariser`);
        `shapes`: each value's shape where it is a tensor, read by the caller (they stand in for the element
        counts: equal shapes, equal counts).

        Each fact is read with one `map` over the values and compared as one list: what costs is the count of
        torch reads per tensor (about 0.1 us each), so the native values are read for four only (device,
        negation, contiguity, address): their layout is not read, as `data_ptr` raises for every layout but the
        strided one (sparse, compressed, mkldnn), which fails the check; their element counts are the caller's
        shapes where it gives them."""
        if len(values) != self.n or list(map(_TYPE_OF, values)) != self.types:
            return False
        ids = list(map(_ID_OF, self.take_tensors(values)))
        if len(set(ids)) != self.distinct_count:
            return False
        if self.repeats_of is not None:  # each repeat is its first's object (ids compared as tuples, in C)
            repeats, firsts = self.repeats_of
            if repeats(ids) != firsts(ids):
                return False
        dv = self.take_distinct(values)
        if dtypes is not None:  # the caller's reads: the distinct values' dtypes taken from them, and no grad
            if len(dtypes) != self.n or list(self.take_distinct(dtypes)) != self.dtypes or self.any_grad:
                return False
        elif list(map(_DTYPE_OF, dv)) != self.dtypes or list(map(_GRAD_OF, dv)) != self.grads:
            return False
        if list(map(_CPU_OF, dv)) != self.cpus:
            return False
        if self.others_layouts and list(map(_LAYOUT_OF, self.take_unread(values))) != self.others_layouts:
            return False
        if self.metas and [v.is_meta for v in self.take_others(values)] != self.metas:
            return False
        nv = self.take_native(values)
        if shapes is not None and self.native_shapes is not None and len(shapes) == self.n:
            if list(self.take_native(shapes)) != self.native_shapes:
                return False
        else:
            shapes = None
            if list(map(_NUMEL_OF, nv)) != self.native_numels:
                return False
        if any(map(_NEG_OF, nv)):  # the kernel reads memory: no negated view
            return False
        try:  # raises for a layout other than strided (read nowhere else for these values)
            if list(map(_CONTIGUOUS_OF, nv)) != self.native_contiguous:
                return False
            ptrs = list(map(_PTR_OF, nv))
        except RuntimeError:
            return False
        if self.aliases_of is not None and self.aliases_of[0](ptrs) != self.aliases_of[1](ptrs):
            return False
        # distinct (address, count, dtype) keys: at once where the addresses are distinct already
        keyed = self.take_keyed(ptrs)
        if len(set(keyed)) != len(keyed) and len(set(zip(keyed, self.keyed_numels, self.keyed_dtypes))) != len(keyed):
            return False
        self._checked = (values, np.fromiter(ptrs, np.int64, len(ptrs)), shapes)
        return True

    def kernel_figures(self, values: Sequence[Any], kernel: Any) -> Optional["Figures"]:
        """`figures` from the one-pass C kernel (native.py): each reduced value read once, its sums in float64;
        None when what is reduced changed size (the values need a plan of their own).

        The C code reads memory by address, so it is told only what was checked of these very values: the
        addresses, dtypes, devices, layouts, element counts and contiguity of the native values (`matches`,
        or the plan made from them; checked again here when `values` are not those), the dtype, element
        count and address of each value converted first (here), and the sizes and strides of each view,
        read as the kernel is called."""
        checked, self._checked = self._checked, None  # not kept: it holds the input's values
        if checked is None or checked[0] is not values:
            if not self.matches(values):
                return None
            checked, self._checked = self._checked, None
        native_ptrs = checked[1]
        raw = np.empty((self.rows, 9), dtype=np.float64)
        held = []  # what is converted or copied here lives until the kernel has read it
        most = kernel.MAX_DIMS
        for g, (dtype, rows, numels, own, own_at, irregular) in enumerate(self.by_dtype):
            ptrs = np.zeros(len(rows), dtype=np.int64)
            ptrs[own] = native_ptrs[own_at]
            views = self.views[g]
            if views is not None:
                arrays = self._views_of(g, views, values, checked[2], len(rows), most)
                if arrays is not None:
                    raw[rows] = kernel.raw(dtype, ptrs, numels, *arrays)
                    continue
            ndims = np.zeros(len(rows), dtype=np.int64)
            kinds = None
            sizes: list[int] = []
            strides: list[int] = []
            for j, i, prepared, kind in irregular:  # in member order: the C code takes the sizes in that order
                tensor = values[i]
                if kind and not tensor.is_neg():  # float16 or bfloat16 on the CPU (the plan's): read where it lies
                    if tensor.numel() != numels[j]:
                        return None
                    if kinds is None:
                        kinds = np.zeros(len(rows), dtype=np.int64)
                    kinds[j] = kind
                    ptrs[j] = tensor.data_ptr()
                    if tensor.is_contiguous():
                        continue
                elif prepared:
                    tensor = _prepared(tensor)
                    if tensor.dtype != dtype or tensor.numel() != numels[j]:
                        return None
                    held.append(tensor)
                    ptrs[j] = tensor.data_ptr()
                    if tensor.is_contiguous():
                        continue
                if tensor.dim() > most:
                    tensor = tensor.contiguous()
                    held.append(tensor)
                    ptrs[j] = tensor.data_ptr()
                    continue
                ndims[j] = tensor.dim()
                sizes += tensor.shape
                strides += tensor.stride()
            raw[rows] = kernel.raw(dtype, ptrs, numels, ndims, np.asarray(sizes, dtype=np.int64),
                                   np.asarray(strides, dtype=np.int64), kinds)
        for i in self.prepared_empty:
            if values[i].numel() != 0:
                return None
        return self._figures_of(values, _kernel_table(raw, self.numel.numpy()))

    def _views_of(self, g: int, views: tuple, values: Sequence[Any], known: Optional[Sequence[Any]], count: int,
                  most: int) -> Optional[tuple]:
        """(ndims, sizes, strides) for the kernel of group `g`, whose irregular members are native views (not
        contiguous: `matches`), their sizes and strides read now (the sizes are the caller's shapes, `known`, where
        `matches` compared them); None where one has more than `most` dimensions (the caller copies it)."""
        take, at = views
        tensors = take(values)
        shapes = list(take(known)) if known is not None else list(map(_SHAPE_OF, tensors))
        strides = list(map(_STRIDE_OF, tensors))
        last = self._view_arrays[g]
        if last is not None and last[0] == shapes and last[1] == strides:
            return last[2:]
        dims = list(map(len, shapes))
        if max(dims) > most:
            return None
        ndims = np.zeros(count, dtype=np.int64)
        ndims[at] = dims
        arrays = (ndims, np.fromiter((n for shape in shapes for n in shape), np.int64, sum(dims)),
                  np.fromiter((n for stride in strides for n in stride), np.int64, sum(dims)))
        self._view_arrays[g] = (shapes, strides) + arrays
        return arrays

    def figures(self, values: Sequence[Any]) -> Optional["Figures"]:
        """The statistics of `values` (which `matches` this plan) from torch's reductions; None when what is
        reduced changed shape or place (the values need a plan of their own)."""
        self._checked = None  # the addresses the kernel would read: not needed here, and they hold the values
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
            parts.append(reduce_rows(matrix))
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
                parts.append(reduce_one(tensor, buffer))
        for i in self.empty:
            if data[i].numel() != 0:
                return None
        return self._figures_of(values, finish(parts, matrices, self.numel) if parts else np.empty((0, 9)))

    def _figures_of(self, values: Sequence[Any], reduced: np.ndarray) -> "Figures":
        """Every value's figures from those of the reduced rows: repeats, aliases, absent and empty values."""
        table = np.concatenate([reduced, _CONSTANT_ROWS])[self.source]
        numels = self.numels
        if self.fill_numels:
            numels = numels.copy()
            numels[self.fill_numels] = [values[i].numel() for i in self.fill_numels]
            numels[self.repeats[:, 0]] = numels[self.repeats[:, 1]]
        return Figures(table, self.counted, numels)


# the figures of a value torch cannot summarise (None, sparse, meta: no counts), and of an empty tensor
_CONSTANT_ROWS = np.array([[_NAN] * 9, [_NAN, _NAN, _NAN, _NAN, 0.0, 0.0, 0.0, 0.0, _NAN]])


def _kernel_table(raw: np.ndarray, numel: np.ndarray) -> np.ndarray:
    """[rows, 9] float64 (mean, std, min, max, abs_sum, l2, n_nan, n_inf, frac_zero) from the kernel's raw
    figures (sum, min, max, magnitude sum, least magnitude, sum of squares, NaN, inf and zero counts)."""
    total, low, high, abs_sum, _, squares, nans, infs, zeros = raw.T
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        var = (squares - total * total / numel) / (numel - 1)
        std = np.where(var > 0, np.sqrt(np.maximum(var, 0.0)), np.where(var == var, 0.0, _NAN))
        std = np.where(numel > 1, std, _NAN)
        holds_nan = nans > 0  # torch's min and max propagate NaN; the kernel's skip it
        table = np.stack([total / numel, std, np.where(holds_nan, _NAN, low), np.where(holds_nan, _NAN, high),
                          abs_sum, np.sqrt(squares), nans, infs, zeros / numel], 1)
    return table


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

    def part(self, start: int, count: int) -> "Figures":
        """The figures of values start..start + count (a row's, of a batch summarised at once)."""
        end = start + count
        return Figures(self.table[start:end], self.counted[start:end], self.numels[start:end])

    def rows(self) -> list[list]:
        """One list `[mean, std, min, max, abs_sum, l2, n_nan, n_inf, frac_zero]` per value (counts as ints or None)."""
        out = self.table.tolist()
        for row, counted in zip(out, self.counted.tolist()):
            if counted:
                row[6], row[7] = int(row[6]), int(row[7])
            else:
                row[6] = row[7] = None
        return out


class ColumnReads(list):
    """Each value's dtype (the list) and `shapes`, each value's shape, as a capture's columns read them: what a
    caller hands `Summariser` as `dtypes` so that the plan check reads neither again."""

    __slots__ = ("shapes",)

    def __init__(self, dtypes: Sequence[Any], shapes: Sequence[Any]):
        super().__init__(dtypes)
        self.shapes = shapes


class Summariser:
    """`summarise` for a run of inputs: the plan of the last input is reused while the next one's values
    fall the same way (`_Plan.matches`), which a schema run the same way on each input does; the
    figures are those a fresh plan gives, bit for bit."""

    def __init__(self, engine: Optional[str] = None) -> None:
        """`engine`: "native-2" (the C kernel, native.py), "torch" (torch's reductions), or None: the kernel where
        this process has it, torch otherwise. `engine` then names the one in use (a store's commits record it)."""
        if engine not in (None, ENGINE, "torch"):
            raise ValueError(f"store statistics engine {engine!r}: expected {ENGINE!r}, 'torch' or None (the kernel "
                             "where it builds)")
        self.kernel = native.kernel() if engine in (None, ENGINE) else None  # None while NNSCHEMAPARSER_NATIVE=0
        if engine == ENGINE and self.kernel is None:
            raise RuntimeError(f"the store's statistics kernel is not available ({native.problem()}); pass "
                               "engine='torch' or None, or install a C compiler")
        self.engine = ENGINE if self.kernel is not None else "torch"
        self.plan: Optional[_Plan] = None
        self.plans: dict[Any, _Plan] = {}  # by key (`__call__`), oldest first

    def _figures(self, plan: _Plan, values: Sequence[Any]) -> Optional[Figures]:
        return plan.kernel_figures(values, self.kernel) if self.kernel is not None else plan.figures(values)

    def __call__(self, values: Sequence[Any], key: Any = None, dtypes: Optional[Sequence[Any]] = None,
                 shapes: Optional[Sequence[Any]] = None) -> Figures:
        """The figures of `values`. `key` (hashable) names a kind of input whose plan is kept apart: the rows of
        a padded batch (store/rows.py) have as many kinds as lengths, each planned once; the last plan of each
        of `_KEYS` keys is kept. The figures do not depend on the key: a plan is used only where it matches.
        `dtypes`: each value's dtype where it is a tensor, as the caller has just read it, with no value
        requiring grad (the logged columns': traces/logged_columns.py); the plan's check takes them instead of
        reading them again. `shapes`: each value's shape where it is a tensor, as the caller has just read it
        (the logged columns'), which the check compares instead of reading the element counts; where `dtypes` is
        a `ColumnReads`, its `shapes` are taken."""
        if shapes is None:
            shapes = getattr(dtypes, "shapes", None)
        plan = self.plan if key is None else self.plans.get(key)
        if plan is not None and plan.matches(values, dtypes, shapes):
            figures = self._figures(plan, values)
            if figures is not None:
                return figures
        plan = _Plan(values)
        if key is None:
            self.plan = plan
        else:
            self.plans.pop(key, None)
            self.plans[key] = plan
            while len(self.plans) > _KEYS:
                self.plans.pop(next(iter(self.plans)))
        figures = self._figures(plan, values)
        if figures is None:  # pragma: no cover - a plan fits the values it was made from
            raise RuntimeError("store statistics: a fresh plan does not fit its own values (a bug: please report it)")
        return figures


def summarise(values: Sequence[Any], engine: Optional[str] = None) -> list[list]:
    """The statistics `[mean, std, min, max, abs_sum, l2, n_nan, n_inf, frac_zero]` of each value (see the
    module docstring); values may repeat (a repeated object is summarised once) or not be tensors."""
    return Summariser(engine)(values).rows()
