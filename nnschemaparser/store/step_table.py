"""The per-step statistics table of a store: its columns (the Parquet schema), and how a unit's inputs become
one Arrow table (`StepColumns`); the figures themselves come from statistics.py.

Depends on numpy, pyarrow (imported when a table is built) and statistics.py.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional

import numpy as np

from .statistics import Figures, Summariser

__all__ = ["COLUMNS", "arrow_schema", "StepColumns", "step_rows"]

# name, arrow type name (see arrow_schema)
COLUMNS = (("sample", "int64"), ("step", "int32"), ("container_id", "string"), ("slot_type", "string"),
           ("block_path", "string"), ("out_var", "string"), ("op_name", "string"), ("description", "string"),
           ("frame_depth", "int32"), ("shape", "list<int64>"), ("dtype", "string"), ("numel", "int64"),
           ("mean", "double"), ("std", "double"), ("min", "double"), ("max", "double"), ("abs_sum", "double"),
           ("l2", "double"), ("n_nan", "int64"), ("n_inf", "int64"), ("frac_zero", "double"), ("kept", "bool"),
           ("omitted", "string"))
_NAMES = [name for name, _ in COLUMNS]


def arrow_schema() -> Any:
    import pyarrow as pa

    types = {"int64": pa.int64(), "int32": pa.int32(), "string": pa.string(), "double": pa.float64(),
             "bool": pa.bool_(), "list<int64>": pa.list_(pa.int64())}
    return pa.schema([(name, types[kind]) for name, kind in COLUMNS])


# The columns an input's steps repeat from the one before when the schema runs the same way (numbers, names,
# descriptions, depths, shapes, dtypes, omissions): each is kept as a list of per-input chunks, and a chunk
# object seen again (the writer hands the same list on: step_names.py, `StepNames.steady`) is made an Arrow
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
