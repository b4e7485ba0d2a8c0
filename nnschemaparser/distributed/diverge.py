"""`diverge_logical`: one process (side a) against a sharded run (side b), by source statement.

Every rank calls `diverge_logical(schema, scope, reference, mesh=...)` with the schema of its own
sharded model (tensor parallel, FSDP2, both) and its own inputs, as it calls `capture_logical`;
`reference` is the one-process model holding the same weights. Rank 0 gets a `DivergeReport` (the
columns of `nnschemaparser.diverge`, so the same views read it); the other ranks get None.

Five runs, under `torch.no_grad()`:

1. b, free, as `capture_logical` (`logical.logical_capture` with `diverge_shards.StepRecorder`): each
   row's part on this rank and its placement; the rows' whole values are gathered (collectives,
   every rank in the same row order) and the root inputs too, unless `reference_inputs` is given;
2. a, free, on every rank: the reference values `A` (every rank needs them to cut its part);
3. b, teacher-forced: each row's part (`L`) is kept, then the variable is bound to the part of
   `A` (cast to b's dtype) that the row's placement gives this rank (`diverge_shards.shard_of`),
   so the next statement starts from a's values; the `L` are gathered;
4. rank 0: a's code on the same cast values with b's weights gathered whole (`whole_weights`, a
   collective run on every rank) in the replay dtype (float32; float64 for a float64 b): `Q`.

Memory: the row values held between runs (each rank's parts `B` and `L`, the reference values `A`,
and on rank 0 the gathered whole values) are `traces/diverge_memory.RowValues` tables sharing one
`Spill` per rank, as in `diverge`: in memory while they fit `memory_budget` (per rank, each storage
counted once), written to a temporary folder past it and read back when used. The free run's own
capture (as `capture_logical`'s) holds its steps' parts until the rows are gathered; it is not
budgeted. `report.memory` gives each rank's peak, bytes and files written (`ranks`).

Carried error: gathered b (free) against `A`; local error: gathered `L` against `Q`; the bound:
`bound_factor * eps` of b's dtype (traces/diverge_bounds.py), as in `diverge`. A statement that
sums over shards (a row-parallel linear's all-reduce, a partial sum) adds its terms in another order
than one process: its local error is that reordering, reported in the `note` column with its size,
and flagged only when it is more than b's dtype explains. Extra columns: `placement` (the row's badge),
`reduced` (a sum over shards happened on the way), `sums_here` (inside this very statement), `note`.

The replacement is the one `diverge`'s own forced run makes (a row listener binding a new tensor to
the name or the return slot after the value is measured), not `interventions=`: it covers every row
of the run, returns included, without one selector per (block, variable, occurrence).

Depends on traces (diverge's runs, bounds and table), `logical`, `diverge_shards`; never on views.
"""

from __future__ import annotations

import math
import time
from typing import Any, Optional

import torch
import torch.distributed as dist

from ..parser.model_parser import NNParser
from ..runtime.interpreter import SchemaInterpreter
from ..schema.model import ModelBlockSchema
from ..traces.diverge import DivergeError, DivergeReport, _line, _table
from ..traces.diverge_align import align_schemas
from ..traces.diverge_bounds import DEFAULT_FACTOR, least_precise, relative_error
from ..traces.diverge_memory import DEFAULT_BUDGET, RowValues, Spill
from ..traces.diverge_runs import RowListener, cast_inputs, model_place, replay_dtype, replay_weights, side_context
from .diverge_shards import ShardRows, StepRecorder, WeightsOf, whole_weights
from .logical import gather, logical_capture
from .placement import local_of

__all__ = ["diverge_logical", "LOGICAL_COLUMNS"]

LOGICAL_COLUMNS = ("placement", "reduced", "sums_here", "note")

SUM_ORDER = "sums over shards: the ranks' terms are added in another order than one process adds them"


def diverge_logical(schema: ModelBlockSchema, scope: dict, reference: torch.nn.Module, *, mesh: Any = None,
                    input_placements: Optional[dict] = None, reference_inputs: Optional[dict] = None,
                    bound_factor: float = DEFAULT_FACTOR,
                    memory_budget: Optional[int] = DEFAULT_BUDGET) -> Optional[DivergeReport]:
    """Compare this sharded run (b) with the one-process `reference` model (a) statement by statement
    (a collective: every rank calls it, with its own schema and inputs).

    `schema`, `scope`, `mesh` and `input_placements` are those of `capture_logical`. `reference` is
    the unsharded model with the same weights, on every rank (its values are cut to each rank's
    part). `reference_inputs` ({name: tensor}) are the whole inputs a runs on; without them each
    root input of `scope` is gathered by its placement (FSDP2's batch shards are joined, a
    replicated input taken as it is). `memory_budget`: the bytes of row values each rank holds
    between runs in memory (default 2 GiB), past it on disk, as in `diverge`; None: no limit.
    Returns a `DivergeReport` on rank 0 (`.table`, `.first`: the first statement whose own error
    is more than b's dtype explains; `.memory`: the largest peak of any rank, the bytes and files
    written by all, and each rank's under `ranks`), None on the other ranks.
    """
    _check(schema, scope, reference, reference_inputs, bound_factor)
    spill = Spill(memory_budget)  # refuses a bad budget on every rank, before any collective
    try:
        return _diverge_logical(schema, scope, reference, mesh, input_placements, reference_inputs, bound_factor,
                                spill)
    finally:
        spill.close()


def _diverge_logical(schema: ModelBlockSchema, scope: dict, reference: torch.nn.Module, mesh: Any,
                     input_placements: Optional[dict], reference_inputs: Optional[dict], bound_factor: float,
                     spill: Spill) -> Optional[DivergeReport]:
    rank = dist.get_rank()
    model_b = schema.module
    device_a, dtype_a = model_place(reference)
    device_b, dtype_b = model_place(model_b) if model_b is not None else (device_a, dtype_a)
    store: dict = {"precision": least_precise(dtype_b, None), "spill": spill}
    timings: dict[str, float] = {}
    rng = torch.get_rng_state()
    with torch.no_grad():
        clock = time.perf_counter()
        roots = (schema.path or schema.name, type(reference).__name__)  # the parser names a root by its class
        free = ShardRows("free", store, None, roots)

        def recorder_class(*args: Any, **kwargs: Any) -> StepRecorder:
            free.recorder = StepRecorder(*args, **kwargs)  # made inside the capture; the rows read its steps
            return free.recorder

        torch.set_rng_state(rng)
        record = logical_capture(schema, dict(scope), mesh, input_placements, recorder_class=recorder_class,
                                 listeners=(free,))
        trace = record.trace
        world = trace.world
        timings["b_free"] = time.perf_counter() - clock
        layouts = {key: trace.placements.get(number) for key, number in free.steps.items() if number is not None}
        if reference_inputs is None:
            reference_inputs = _whole_inputs(trace, scope)
        gathered_b = _gather_rows(free, store.pop("B", {}), layouts, world, spill if rank == 0 else None)
        del record, trace

        clock = time.perf_counter()
        inputs_a = cast_inputs(reference_inputs, device_a, dtype_a)
        schema_a = NNParser.parse_model(reference, inputs_tensors_values=inputs_a)
        timings["parse_a"] = time.perf_counter() - clock
        alignment = align_schemas(schema_a, schema_a)  # b runs a's code (its rows are keyed as a's)
        keep = RowListener("a", "keep", alignment, store)
        clock = time.perf_counter()
        torch.set_rng_state(rng)
        SchemaInterpreter(listeners=[keep]).run(schema_a, dict(inputs_a))
        timings["a"] = time.perf_counter() - clock
        for key in list(gathered_b):  # each taken out as it is compared: its memory (or file) goes at once
            value = gathered_b.pop(key)
            reference_value = store["A"].get(key)
            if reference_value is not None:
                store.setdefault("carried", {})[key] = relative_error(value, reference_value)
        value = reference_value = None

        force = ShardRows("force", store, world, roots)
        force.layouts = layouts
        clock = time.perf_counter()
        torch.set_rng_state(rng)
        SchemaInterpreter(listeners=[force]).run(schema, dict(scope))
        timings["b_force"] = time.perf_counter() - clock
        store["L"] = _gather_rows(force, store.pop("Lpart", {}), layouts, world, spill if rank == 0 else None)
        weights = whole_weights(model_b) if model_b is not None else {}
        if rank != 0:
            torch.set_rng_state(rng)
            store.clear()
            dist.gather_object(_memory(spill), None, dst=0)  # this rank's rows are done: its figures are final
            return None
        everyone: list = [None] * dist.get_world_size()
        dist.gather_object(None, everyone, dst=0)

        replay = replay_dtype(store["precision"])
        replay_inputs = cast_inputs(cast_inputs(reference_inputs, device_a, dtype_b), device_a, replay)
        listener = RowListener("a", "replay", alignment, store)
        clock = time.perf_counter()
        torch.set_rng_state(rng)
        with replay_weights(reference, WeightsOf(weights), replay), side_context(None, None, device_a):
            SchemaInterpreter(listeners=[listener]).run(schema_a, replay_inputs)
        torch.set_rng_state(rng)
        timings["a_replay"] = time.perf_counter() - clock
    table = _table({"keep": keep, "force": force, "replay": listener}, store, alignment, bound_factor)
    _annotate(table, free, force, layouts)
    store.clear()
    everyone[0] = _memory(spill)
    memory = {"budget": spill.budget, "peak_held": max(m["peak_held"] for m in everyone),
              "written": sum(m["written"] for m in everyone), "files": sum(m["files"] for m in everyone),
              "ranks": everyone}
    flagged = table[table["flagged"]]
    first = _line(flagged.iloc[0]) if len(flagged) else None
    return DivergeReport(table, first, schema_a, schema, reference, model_b,
                         {"inputs": inputs_a, "device": device_a, "dtype": dtype_a},
                         {"inputs": dict(scope), "device": device_b, "dtype": dtype_b, "mesh": world},
                         alignment, None, None, timings, float(bound_factor), memory)


def _check(schema: Any, scope: Any, reference: Any, reference_inputs: Any, bound_factor: Any) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise DivergeError("diverge_logical needs an initialised process group (torch.distributed.init_process_group, "
                           "or torchrun) and is called on every rank; to compare two one-process models, use diverge")
    if not isinstance(schema, ModelBlockSchema):
        raise DivergeError(f"schema must be the ModelBlockSchema of this rank's sharded model "
                           f"(NNParser.parse_model(model, ...)), got {type(schema).__name__}")
    if not isinstance(reference, torch.nn.Module):
        raise DivergeError(f"reference must be the one-process nn.Module with the same weights, got "
                           f"{type(reference).__name__}")
    for name, model in (("reference", reference), ("the sharded model", schema.module)):
        training = [n or "(root)" for n, m in model.named_modules() if m.training] if model is not None else []
        if training:
            raise DivergeError(f"{name} is in training mode ({', '.join(training[:3])}): dropout would draw other "
                               "masks in each run; call .eval() on it first")
    for name, value in (("scope", scope), ("reference_inputs", reference_inputs)):
        if value is not None and (not isinstance(value, dict) or not all(isinstance(k, str) for k in value)):
            raise DivergeError(f"{name} must be a dict of input name -> tensor, got {type(value).__name__}")
    if scope is None:
        raise DivergeError("scope must be a dict of input name -> tensor (this rank's inputs)")
    if not isinstance(bound_factor, (int, float)) or isinstance(bound_factor, bool) or not bound_factor > 0:
        raise DivergeError(f"bound_factor must be a positive number, got {bound_factor!r}")


def _whole_inputs(trace: Any, scope: dict) -> dict:
    """Each tensor of `scope` gathered by the placement its input step got (a collective)."""
    steps = {step.out_var: step for step in trace.steps if step.slot_type == "input"}
    whole = {}
    for name, value in scope.items():
        if not isinstance(value, torch.Tensor):
            whole[name] = value
            continue
        step = steps.get(name)
        layout = trace.placements.get(step.step) if step is not None else None
        if layout is None or not layout.known:
            why = layout.describe() if layout is not None else "it was not recorded"
            raise DivergeError(f"the whole value of input {name!r} cannot be gathered ({why}); pass "
                               f"diverge_logical(..., reference_inputs={{{name!r}: whole}}) or input_placements=")
        whole[name] = gather(local_of(step.value if step.value is not None else value), layout, trace.world)
    return whole


def _memory(spill: Spill) -> dict:
    return {"peak_held": spill.peak, "written": spill.written, "files": spill.files}


def _gather_rows(listener: ShardRows, parts: Any, layouts: dict, world: Any, spill: Optional[Spill]) -> Any:
    """Every row's whole value from the ranks' `parts` (collectives, the rows in run order on every
    rank); kept, within `spill`'s budget, on the rank given one (rank 0)."""
    out = RowValues(spill) if spill is not None else {}
    keep = spill is not None
    keys = [key for key in listener.rows if key in parts and layouts.get(key) is not None and layouts[key].known]
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, keys)  # one more collective, so a rank that ran other rows fails, never hangs
    for rank, theirs in enumerate(everyone):
        if theirs != keys:
            raise DivergeError(f"rank {rank} bound other rows than rank {dist.get_rank()} in b's "
                               f"{listener.mode} run ({len(theirs)} vs {len(keys)}); every rank must run the "
                               "same statements (the same control flow) for their values to be gathered")
    for key in keys:
        value = gather(parts.pop(key), layouts[key], world)
        if keep:
            out[key] = value
    return out


def _annotate(table: Any, free: ShardRows, force: ShardRows, layouts: dict) -> None:
    """The columns of `LOGICAL_COLUMNS`, row by row."""
    keys = list(force.rows) + [k for k in free.rows if k not in force.rows]
    by_row = {}
    for key in keys:
        info = force.rows.get(key) or free.rows.get(key)
        by_row[(info.path, info.filename, info.lineno, info.var, key[1])] = key
    placements, reduced, sums, notes = [], [], [], []
    for row in table.itertuples(index=False):
        key = by_row.get((row.block_path, row.file, row.line, row.out_var, row.occurrence))
        layout = layouts.get(key) if key is not None else None
        placements.append(layout.badge() if layout is not None else None)
        reduced.append(bool(layout is not None and layout.reduced))
        here = bool(free.sums.get(key, False)) if key is not None else False
        sums.append(here)
        notes.append(_note(row, layout, here, force.not_forced.get(key)))
    table["placement"], table["reduced"], table["sums_here"], table["note"] = placements, reduced, sums, notes


def _note(row: Any, layout: Any, here: bool, not_forced: Optional[str]) -> str:
    if layout is None or not layout.known:
        why = layout.source if layout is not None else "no step of the logical capture"
        return f"placement unknown ({why}): not gathered, not compared"
    parts = []
    if here:
        within = "beyond" if row.flagged else "within"
        parts.append(f"this statement {SUM_ORDER}; it adds a relative error of {row.local_error:.3g} ({within} "
                     f"the bound {row.bound:.3g} of b's dtype)")
    elif row.flagged:
        parts.append(f"its own error {row.local_error:.3g} is beyond the bound {row.bound:.3g} of b's dtype")
    elif layout.reduced and not math.isnan(row.carried_error):
        parts.append(f"computed from a value that {SUM_ORDER}; it carries a relative error of {row.carried_error:.3g}")
    elif row.local_error > 0:
        parts.append(f"differs from one process by {row.local_error:.3g} although no sum over shards is involved: "
                     "the rank's kernel computes its part (another shape) with other roundings")
    if not_forced:
        parts.append(f"not forced ({not_forced}): the next statements carry this one's error")
    return "; ".join(parts)
