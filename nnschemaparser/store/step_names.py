"""What each step of an input gives the store's rows: the step fields of a capture, and the per-schema caches
of the metadata they repeat from input to input (container-id prefixes, keep flags, the last input's lists).

`StepNames.fields` captures one input: through `traces.logged_columns.LoggedColumns` where capture_run
would log the run (the span's metadata reused from the last input that ran the same way, no record
per step), otherwise with capture_run (or the caller's `run`) and the trace's records.

Depends on numpy, torch and traces (capture, selection, trace, logged_columns).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np
import torch

from ..schema.model import ModelBlockSchema
from ..traces.logged_columns import LoggedColumns
from ..traces.record import capture_run
from ..traces.selection import KeepSelector, is_block_call
from ..traces.trace import container_id
from .statistics import ColumnReads, Summariser

__all__ = ["StepNames", "step_fields"]


_RECORD_FIELDS = 12  # a pending record of the recorder (traces/recorder.py, `_build_steps`)


def step_fields(trace: Any) -> tuple:
    """The parallel lists (numbers, descriptions, slot types, out vars, op names, block paths, values, depths,
    omitted, shapes, dtypes: torch dtypes or their texts) of a trace's steps.

    A fresh capture holds its steps as the recorder's pending records (one list per tensor, in the field
    order `_build_steps` documents): they are read as they are, without building a TraceStep each (a
    third of a small model's capture). A trace already built, or records of another layout, are read
    from `trace.steps`.
    """
    pending = trace.pending_records() if hasattr(trace, "pending_records") else None
    if pending and not trace._steps and set(map(len, pending)) == {_RECORD_FIELDS}:
        numbers, descriptions, slot_types, out_vars, op_names, block_paths, values, depths, omitted, _, shapes, \
            dtypes = map(list, zip(*pending))
        return numbers, descriptions, slot_types, out_vars, op_names, block_paths, values, depths, omitted, shapes, dtypes
    steps = trace.steps
    return ([s.step for s in steps], [s.description for s in steps], [s.slot_type for s in steps],
            [s.out_var for s in steps], [s.op_name for s in steps], [s.block_path for s in steps],
            [s.tensor.value for s in steps], [s.frame_depth for s in steps], [s.omitted for s in steps],
            [s.tensor.shape for s in steps], [s.tensor.dtype for s in steps])


_DTYPE_TEXT: dict[Any, str] = {}


def _dtype_text(dtype: Any) -> str:
    text = _DTYPE_TEXT[dtype] = str(dtype)
    return text


class StepNames:
    """Per-schema caches of what each step's metadata gives: its container-id prefix, whether it is kept."""

    def __init__(self, selector: Optional[KeepSelector], schema: Optional[ModelBlockSchema] = None):
        self.selector = selector
        self.logged = LoggedColumns(schema) if schema is not None else None
        self.prefixes: dict[tuple, str] = {}
        self.keeps: dict[tuple, bool] = {}
        self.last: Optional[tuple] = None  # the previous input's metadata lists, container ids and keep flags
        self.summarise = Summariser()  # its plan is reused from input to input (statistics.py)
        self.warned = False  # whether a keep that kept nothing over an input was said (`_summarise_one`)
        # the dtypes and shapes of the last logged input's values, as its columns read them (none of its values
        # requires grad): the summariser's plan check takes them (`Summariser.__call__`); None after another capture
        self.dtypes: Optional[ColumnReads] = None

    def steady(self, fields: tuple) -> tuple:
        """(numbers, slot types, block paths, out vars, op names, descriptions, depths, shapes, dtype texts,
        omitted), container ids, keep flags (named by the selector), keepable flags (named, or a root input)
        of an input's steps. When its metadata lists (dtypes as torch dtypes) equal the previous input's (a
        schema run the same way; compared as lists, in C), the previous results themselves, so the dtype
        texts, container ids and keep flags are not worked out again and the step columns convert each
        list once."""
        last = self.last
        if last is not None and all(a == b for a, b in zip(last[0], fields)):
            return last[1:]
        raw = fields
        numbers, slot_types, block_paths, out_vars, op_names = fields[:5]
        fields = fields[:8] + ([d if isinstance(d, str) else _DTYPE_TEXT.get(d) or _dtype_text(d) for d in fields[8]],) + \
            fields[9:]
        prefix = self.prefix
        cids = [prefix(t, b) + (f"{n:04d}") for t, b, n in zip(slot_types, block_paths, numbers)]
        descriptions = fields[5]
        named = [self.keeps_step(b, o, p, t, d) for b, o, p, t, d in
                 zip(block_paths, out_vars, op_names, slot_types, descriptions)]
        keepable = np.array([k or t == "input" for k, t in zip(named, slot_types)], dtype=bool)
        self.last = (raw, fields, cids, named, keepable)
        return self.last[1:]

    def prefix(self, slot_type: str, block_path: str) -> str:
        key = (slot_type, block_path)
        text = self.prefixes.get(key)
        if text is None:  # the container-id rule of traces/trace.py: input_, output_, or the block path
            text = self.prefixes[key] = container_id(slot_type if slot_type != "activation" else block_path, 0)[:-4]
        return text

    def keeps_step(self, block_path: str, out_var: str, op_name: str, slot_type: str, description: str = "") -> bool:
        selector = self.selector
        key = (block_path, out_var, op_name, slot_type, selector is not None and selector.calls and
               is_block_call(description))
        named = self.keeps.get(key)
        if named is None:
            named = self.keeps[key] = selector is not None and selector.matches(*key)
        return named


    def fields(self, schema: ModelBlockSchema, scope: dict, interventions: Any = None,
               run: Optional[Callable] = None) -> tuple[list, tuple]:
        """(outputs, step fields) of one input's capture of everything, under `torch.no_grad()`: the logged
        run's columns where capture_run would log it and no `run` or `interventions` is given."""
        self.dtypes = None
        with torch.no_grad():
            if run is None and interventions is None and self.logged is not None and self.logged.schema is schema:
                got = self.logged.capture(scope)
                if got is not None:
                    self.dtypes = ColumnReads(got[1][10], got[1][9])  # with the shapes the columns read
                    return got
            record = (run or capture_run)(schema, scope, interventions=interventions)
        return record.outputs, step_fields(record.trace)


