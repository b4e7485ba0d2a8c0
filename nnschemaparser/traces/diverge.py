"""`diverge(model_a, model_b, inputs)`: where two configurations part ways, by source statement.

Side a is the reference, side b the configuration under test: another dtype (`model.to(torch.bfloat16)`,
float16, float64), autocast (`autocast_b=torch.bfloat16`), CPU settings (`settings_b={"threads": 1,
"deterministic": True, "mkldnn": False}`, or a callable returning any context manager), another
device (a CUDA copy), another version of the model's code (an instance of another class loaded with
the same state_dict), or a `torch.compile` wrapper (handed to `traces/diverge_compile.py` when it is
installed). Each side's inputs are `inputs` moved to its model's device, floating tensors cast to
its model's floating dtype.

Four schema runs, under `torch.no_grad()` (traces/diverge_runs.py):

1. a, free: the reference values `A` of every row (a tensor bound to a source name, or returned);
2. b, free: each row's *carried* error against `A`;
3. b, teacher-forced: each row's value `L`, computed from a's values cast to b's dtype and device
   (every row's variable is replaced by `A` cast so, after it is measured);
4. a's code with b's weights in float32 (float64 when b is float64: `diverge_runs.replay_dtype`),
   teacher-forced the same way: `Q`, the statement's value on the same cast inputs computed at least
   as precisely as b could; the row's *local* error is `L` against `Q`.

Where b has a's dtype and weights and neither side autocasts (a code version, CPU settings), run 4
would be run 1 again: it is not made, and `L` is measured against `A` (diverge_runs.replay_is_keep).
Row values are held between runs up to `memory_budget`, past it on disk (traces/diverge_memory.py).

A row is flagged when its local error is above what b's dtype explains (traces/diverge_bounds.py:
`bound_factor * eps` of b's precision, errors relative to the value's scale). Rows are aligned by statement
(traces/diverge_align.py), not by step: block path, a's file and line, variable, occurrence.

Depends on schema, runtime, parser and traces; never on views.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional

import torch

from ..parser.model_parser import NNParser
from ..runtime.interpreter import SchemaInterpreter
from ..schema.errors import SchemaRunError
from ..schema.model import ModelBlockSchema
from .diverge_align import Alignment, align_schemas
from .diverge_bounds import DEFAULT_FACTOR, bound_of, least_precise
from .diverge_memory import DEFAULT_BUDGET, Spill
from .diverge_runs import (RowListener, cast_inputs, check_side, model_place, replay_dtype, replay_is_keep,
                           replay_weights, side_context)

__all__ = ["diverge", "DivergeReport", "DivergeLine", "DivergeError", "COLUMNS", "STATUSES"]

COLUMNS = ("block_path", "file", "line", "source", "out_var", "occurrence", "local_error", "carried_error", "bound",
           "flagged", "status", "source_a", "line_a")
STATUSES = ("matched", "edited", "inserted", "deleted", "untaken")


class DivergeError(SchemaRunError):
    """`diverge` cannot compare the two configurations as given (inputs, models, a missing part)."""


@dataclass(frozen=True)
class DivergeLine:
    """One row of a report: the statement (b's file and line; a's for a row of a alone), its variable
    and occurrence, its errors and bound, and its status."""

    block_path: str
    file: str
    line: int
    source: str
    out_var: str
    occurrence: int
    local_error: float
    carried_error: float
    bound: float
    flagged: bool
    status: str

    def __str__(self) -> str:
        where = f"{self.block_path or '(root)'} at {self.file}:{self.line}"
        err = f"local error {self.local_error:.3g} > bound {self.bound:.3g}" if self.flagged else \
            f"local error {self.local_error:.3g}"
        return f"{where}: {self.source.splitlines()[0] if self.source else ''} [{self.out_var}] ({err})"


def _size(count: int) -> str:
    """`512 B`, `16.0 KiB`, `1.5 MiB`, `2.0 GiB`: a small budget is not shown as 0.0 MiB."""
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{int(count)} B"


@dataclass
class DivergeReport:
    """What `diverge` returns.

    `table`: a pandas DataFrame, one row per aligned row in run order (`COLUMNS`); `first`: the first
    flagged row as a `DivergeLine`, or None. Everything a view needs to show and step both runs is
    kept: the schemas, the models, each side's inputs and settings (`side_a`, `side_b`), the
    alignment, the outputs, `timings` (seconds per run; `local` where the replay was not needed) and
    `memory` (the budget, the most bytes of row values held at once, bytes and files written past it)."""

    table: Any
    first: Optional[DivergeLine]
    schema_a: Any = field(repr=False, default=None)
    schema_b: Any = field(repr=False, default=None)
    model_a: Any = field(repr=False, default=None)
    model_b: Any = field(repr=False, default=None)
    side_a: dict = field(repr=False, default_factory=dict)
    side_b: dict = field(repr=False, default_factory=dict)
    alignment: Optional[Alignment] = field(repr=False, default=None)
    outputs_a: Any = field(repr=False, default=None)
    outputs_b: Any = field(repr=False, default=None)
    timings: dict = field(repr=False, default_factory=dict)
    bound_factor: float = DEFAULT_FACTOR
    memory: dict = field(repr=False, default_factory=dict)

    @property
    def flagged(self) -> Any:
        """The flagged rows of `table`."""
        return self.table[self.table["flagged"]]

    def summary(self) -> str:
        """A few lines: rows per status, how many are flagged, the first culprit and the run times."""
        counts = self.table["status"].value_counts().to_dict() if len(self.table) else {}
        parts = ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts.get(s))
        lines = [f"diverge: {len(self.table)} rows ({parts or 'none'}), {int(self.table['flagged'].sum()) if len(self.table) else 0} "
                 f"flagged (local error > {self.bound_factor:g} x eps of b's dtype)"]
        lines.append(f"first: {self.first}" if self.first is not None else "first: none (every local error is "
                                                                         "within what b's dtype explains)")
        if self.timings:
            lines.append("timings: " + ", ".join(f"{k} {v:.3f}s" for k, v in self.timings.items()))
        if self.memory.get("files"):
            lines.append(f"memory: held at most {_size(self.memory['peak_held'])} of row values, "
                         f"{self.memory['files']} more ({_size(self.memory['written'])}) went to disk "
                         f"past the budget of {_size(self.memory['budget'])}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<DivergeReport {self.summary()}>"

    #: What opens the Diverge view: set by the widget stage (widget/diverge_widget.py) when it is
    #: imported; this stage never imports the widget itself.
    viewer: ClassVar[Optional[Callable[..., Any]]] = None

    def show(self, **options: Any) -> Any:
        """The inspector's Diverge view of this report (an anywidget; needs the `widget` extra): b's
        source lines with a local-error bar each (log scale, bound marked), the first culprit
        highlighted, and both runs stepped to a line clicked. `options` go to InspectorWidget."""
        if DivergeReport.viewer is None:
            try:  # by name: the widget stage registers the viewer (traces may not import it)
                importlib.import_module("nnschemaparser.widget.diverge_widget")
            except ImportError as exc:
                raise DivergeError(f"report.show() needs the inspector widget, which could not be imported ({exc}); "
                                   "install anywidget (pip install 'nnschemaparser[widget]') or read report.table, "
                                   "report.first and report.summary()") from exc
        return DivergeReport.viewer(self, **options)


def diverge(model_a: torch.nn.Module, model_b: torch.nn.Module, inputs: dict, *,
            autocast_a: Optional[torch.dtype] = None, autocast_b: Optional[torch.dtype] = None,
            settings_a: Any = None, settings_b: Any = None, bound_factor: float = DEFAULT_FACTOR,
            schema_a: Optional[ModelBlockSchema] = None, schema_b: Optional[ModelBlockSchema] = None,
            memory_budget: Optional[int] = DEFAULT_BUDGET) -> DivergeReport:
    """Compare configuration b against reference a statement by statement; name the first line whose
    own error is more than b's dtype explains.

    `inputs` ({name: tensor or value}) is moved to each model's device, floating tensors cast to
    its floating dtype. `autocast_a` / `autocast_b` (torch.bfloat16 or torch.float16) run that side
    under `torch.autocast` on its device. `settings_a` / `settings_b`: a dict of `threads` (int),
    `deterministic` (bool, `torch.use_deterministic_algorithms`) and `mkldnn` (bool), or a callable
    returning a context manager the side's runs happen in. One model may be both sides. `schema_a` /
    `schema_b` reuse schemas already parsed from these models (the parse is skipped).
    `bound_factor`: a row is flagged when its local error is above `bound_factor * eps` of b's
    precision, the less precise of its model's dtype and its autocast dtype (traces/diverge_bounds.py).

    `memory_budget`: the bytes of row values held between runs in memory (default 2 GiB; each storage
    counted once); past it they go to a temporary folder and are read back when used
    (traces/diverge_memory.py), None: no limit. `report.memory` says how much was held and written.

    A `torch.compile` wrapper as `model_b` is localized by `traces/diverge_compile.py`
    (compiled regions made smaller, down to statements). Returns a `DivergeReport`.
    """
    check_side(settings_a, autocast_a)
    check_side(settings_b, autocast_b)
    for name, model in (("model_a", model_a), ("model_b", model_b)):
        if not isinstance(model, torch.nn.Module):
            raise DivergeError(f"{name} must be an nn.Module instance, got {type(model).__name__}")
        training = [name or "(root)" for name, module in model.named_modules() if module.training]
        if training:
            raise DivergeError(f"{name} is in training mode ({', '.join(training[:3])}"
                               f"{', ...' if len(training) > 3 else ''}): dropout would draw different masks in "
                               f"each of diverge's runs and batch norm would update its statistics; call "
                               f"{name}.eval() first")
    if not isinstance(inputs, dict) or not all(isinstance(k, str) for k in inputs):
        raise DivergeError(f"inputs must be a dict of input name -> tensor (the forward's parameter names), got "
                           f"{type(inputs).__name__}; e.g. diverge(a, b, {{'input_ids': ids}})")
    if not isinstance(bound_factor, (int, float)) or isinstance(bound_factor, bool) or not bound_factor > 0:
        raise DivergeError(f"bound_factor must be a positive number, got {bound_factor!r}")
    spill = Spill(memory_budget)  # refuses a bad budget before any run
    if _is_compiled(model_b):
        return _diverge_compiled(model_a, model_b, inputs, schema_a)
    if _is_compiled(model_a):
        raise DivergeError("model_a is a torch.compile wrapper; the reference side must be eager: pass the "
                           "compiled model as model_b and its original (model._orig_mod) as model_a")
    device_a, dtype_a = model_place(model_a)
    device_b, dtype_b = model_place(model_b)
    inputs_a = cast_inputs(inputs, device_a, dtype_a)
    inputs_b = cast_inputs(inputs, device_b, dtype_b)
    side_a = {"inputs": inputs_a, "device": device_a, "dtype": dtype_a, "autocast": autocast_a, "settings": settings_a}
    side_b = {"inputs": inputs_b, "device": device_b, "dtype": dtype_b, "autocast": autocast_b, "settings": settings_b}
    timings: dict[str, float] = {}
    with torch.no_grad():
        clock = time.perf_counter()
        if schema_a is None:
            with side_context(settings_a, autocast_a, device_a):
                schema_a = NNParser.parse_model(model_a, inputs_tensors_values=inputs_a)
        if schema_b is None:
            if model_b is model_a and autocast_b == autocast_a:
                schema_b = schema_a
            else:
                with side_context(settings_b, autocast_b, device_b):
                    schema_b = NNParser.parse_model(model_b, inputs_tensors_values=inputs_b)
        timings["parse"] = time.perf_counter() - clock
        same_code = schema_b is schema_a or type(model_a) is type(model_b)
        alignment = align_schemas(schema_a, schema_b, same=same_code)
        store: dict = {"precision": least_precise(dtype_b, autocast_b), "spill": spill}
        replay = replay_dtype(store["precision"])
        # b's dtype is a's and its weights are a's: the replay would be a's free run again (Q is A), so
        # the force run measures each local error against A itself and the replay is not made
        store["replay_is_keep"] = (dtype_b == dtype_a == replay and autocast_a is None and autocast_b is None
                                   and replay_is_keep(model_a, model_b, replay))
        runs = [("a", "keep", schema_a, inputs_a, side_context(settings_a, autocast_a, device_a)),
                ("b", "carry", schema_b, inputs_b, side_context(settings_b, autocast_b, device_b)),
                ("b", "force", schema_b, inputs_b, side_context(settings_b, autocast_b, device_b)),
                ("a", "replay", schema_a, None, None)]
        listeners = {}
        outputs = {}
        rng = torch.get_rng_state()  # every run draws what the first drew (a model sampling in eval)
        try:
            for side, mode, schema, scope, context in runs:
                listener = RowListener(side, mode, alignment, store)
                clock = time.perf_counter()
                if mode == "replay":
                    if store["replay_is_keep"] and not store.get("lossy"):
                        listeners["force"].local_errors()  # Q is A: the replay is not made
                        timings["local"] = time.perf_counter() - clock
                        break
                    scope = {k: (v.to(device=device_a, dtype=replay) if v.is_floating_point() else v.to(device_a))
                             if isinstance(v, torch.Tensor) else v for k, v in inputs_b.items()}
                    context = _replay_context(model_a, model_b, replay, settings_a, device_a)
                torch.set_rng_state(rng)
                with context:
                    result = SchemaInterpreter(listeners=[listener]).run(schema, dict(scope))
                timings[f"{side}_{mode}"] = time.perf_counter() - clock
                listeners[mode] = listener
                if mode in ("keep", "carry"):
                    outputs[side] = result
        finally:
            torch.set_rng_state(rng)
            spill.close()
    clock = time.perf_counter()
    table = _table(listeners, store, alignment, bound_factor)
    timings["table"] = time.perf_counter() - clock
    store.clear()
    flagged = table[table["flagged"]]
    first = _line(flagged.iloc[0]) if len(flagged) else None
    memory = {"budget": spill.budget, "peak_held": spill.peak, "written": spill.written, "files": spill.files}
    return DivergeReport(table, first, schema_a, schema_b, model_a, model_b, side_a, side_b, alignment,
                         outputs.get("a"), outputs.get("b"), timings, float(bound_factor), memory)


@contextlib.contextmanager
def _replay_context(model_a: Any, model_b: Any, replay: torch.dtype, settings_a: Any, device_a: torch.device) -> Any:
    """The replay's context: a's weights holding b's in the replay dtype, a's settings, no autocast."""
    with replay_weights(model_a, model_b, replay), side_context(settings_a, None, device_a):
        yield


def _is_compiled(model: Any) -> bool:
    return type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod")


def _diverge_compiled(model_a: Any, model_b: Any, inputs: dict, schema_a: Optional[ModelBlockSchema]) -> DivergeReport:
    try:
        compiled = importlib.import_module("nnschemaparser.traces.diverge_compile")
    except ImportError as exc:
        raise DivergeError("model_b is a torch.compile wrapper, and localizing inside compiled regions needs "
                           "nnschemaparser.traces.diverge_compile, which this installation does not have; compare "
                           "the eager model (model_b._orig_mod) under the settings you suspect instead") from exc
    device_a, dtype_a = model_place(model_a)
    if schema_a is None:
        with torch.no_grad():
            schema_a = NNParser.parse_model(model_a, inputs_tensors_values=cast_inputs(inputs, device_a, dtype_a))
    rows = compiled.compiled_local_errors(schema_a, model_a, model_b, inputs)
    import pandas as pd

    table = pd.DataFrame([{**{c: None for c in COLUMNS}, "status": "matched", **row} for row in rows])
    if not len(table):
        table = pd.DataFrame(columns=[*COLUMNS, "region"])
    table["flagged"] = table["flagged"].astype(bool) if len(table) else table["flagged"]
    flagged = table[table["flagged"]] if len(table) else table
    first = _line(flagged.iloc[0]) if len(flagged) else None
    device_b, dtype_b = model_place(model_b._orig_mod)
    side_a = {"inputs": cast_inputs(inputs, device_a, dtype_a), "device": device_a, "dtype": dtype_a}
    side_b = {"inputs": cast_inputs(inputs, device_b, dtype_b), "device": device_b, "dtype": dtype_b, "compiled": True}
    # schema_b stays None: b's values exist only inside compiled regions; the Diverge view steps b's
    # own code (model_b._orig_mod) run without the compiler beside a (widget/diverge_widget.py)
    return DivergeReport(table, first, schema_a, None, model_a, model_b, side_a, side_b)


def _line(row: Any) -> DivergeLine:
    return DivergeLine(row["block_path"], row["file"], int(row["line"]), row["source"], row["out_var"],
                       int(row["occurrence"]), float(row["local_error"]), float(row["carried_error"]),
                       float(row["bound"]) if row["bound"] is not None else math.nan, bool(row["flagged"]),
                       row["status"])


def _merged_order(a_rows: dict, b_rows: dict) -> list[tuple]:
    """Every key in b's run order, a's keys alone placed after the last key both have before them."""
    a_order = sorted(a_rows, key=lambda k: a_rows[k].order)
    a_pos = {k: i for i, k in enumerate(a_order)}
    merged: list[tuple] = []
    ia = 0
    for key in sorted(b_rows, key=lambda k: b_rows[k].order):
        pos = a_pos.get(key)
        if pos is not None:
            while ia < pos:
                if a_order[ia] not in b_rows:
                    merged.append(a_order[ia])
                ia += 1
            ia = max(ia, pos + 1)
        merged.append(key)
    merged.extend(k for k in a_order[ia:] if k not in b_rows)
    return merged


def _table(listeners: dict, store: dict, alignment: Alignment, factor: float) -> Any:
    import pandas as pd

    a_rows, b_rows = listeners["keep"].rows, listeners["force"].rows
    carried = store.get("carried", {})
    local = store.get("local", {})
    records = []
    for key in _merged_order(a_rows, b_rows):
        info_b, info_a = b_rows.get(key), a_rows.get(key)
        base, occurrence = key
        if info_b is not None:
            where = (info_b.path, info_b.filename, info_b.lineno)
            paired = alignment.b_to_a.get(where)
            if info_a is not None:
                status = paired[2] if paired is not None else "matched"
            elif paired is not None:
                status = "untaken"  # the statement is in both schemas; a's run did not bind this row
            else:
                status = "inserted"
            info = info_b
            source = alignment.statement_of("b", *where) or ""
        else:
            info = info_a
            where = (info_a.path, info_a.filename, info_a.lineno)
            status = "untaken" if where in alignment.a_paired else "deleted"
            source = alignment.statement_of("a", *where) or ""
        err, dtype = local.get(key, (math.nan, None))
        if status == "inserted" and key in store.get("inserted", {}):
            err, dtype = store["inserted"][key], store.get("dtype", {}).get(key)
        bound = bound_of(dtype, factor) if info_b is not None and info_b.dtype.is_floating_point else None
        flagged = bool(bound is not None and not math.isnan(err) and err > bound)
        source_a = line_a = None
        if status == "edited" and info_a is not None:
            source_a = alignment.statement_of("a", info_a.path, info_a.filename, info_a.lineno)
            line_a = info_a.lineno
        records.append({
            "block_path": info.path, "file": info.filename, "line": info.lineno, "source": source,
            "out_var": info.var, "occurrence": occurrence, "local_error": err,
            "carried_error": carried.get(key, math.nan), "bound": bound if bound is not None else math.nan,
            "flagged": flagged, "status": status, "source_a": source_a, "line_a": line_a,
        })
    return pd.DataFrame.from_records(records, columns=list(COLUMNS))
