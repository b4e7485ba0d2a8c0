"""One logical model: `capture_logical` runs the schema on every rank and `LogicalTrace` gathers values.

`capture_logical(schema, scope, mesh=...)` is `capture_run` with a `LogicalRecorder`: each rank
records its own values (shards, replicas, partial sums) and a `Layout` per step. After the run the
ranks compare what they recorded (`consolidate`, one `all_gather_object` over the default group):
the same steps on every rank, the same layouts (a step whose layout differs between ranks becomes
unknown), and every value assumed replicated really equal (by digest) across each mesh dimension.

`LogicalTrace.logical(container_id)` gathers a step's whole value from the ranks' parts: shards are
concatenated along their tensor dimension, partial sums all-reduced, replicas taken as they are,
innermost mesh dimension first. It is a collective: **every rank must call it, in the same order**,
as with any `torch.distributed` call (a rank that does not call it leaves the others waiting until
the process group's timeout). `logical_trace()` is a plain `ActivationTrace` of the gathered values,
so its DataFrame, histograms and `compare_traces` are those of one process; `logical_dataframe()`
adds the placement columns.

Depends on `placement`, `recorder` and traces.
"""

from __future__ import annotations

import gc
import itertools
from typing import Any, Optional

import torch
import torch.distributed as dist

from ..runtime.interpreter import SchemaInterpreter
from ..schema.errors import SchemaRunError
from ..schema.model import ModelBlockSchema, TensorContainer
from ..traces.record import ExecutionRecord, _root_scope
from ..traces.trace import ActivationTrace, TraceStep
from .placement import UNKNOWN, Layout, _dim_names, find_world_mesh, fsdp_mesh_dims, local_of
from .recorder import LogicalRecorder

__all__ = ["LogicalTrace", "LogicalCaptureError", "capture_logical"]


class LogicalCaptureError(SchemaRunError):
    """The ranks of a logical capture disagree (different steps), or a value cannot be gathered."""


class LogicalTrace(ActivationTrace):
    """An ActivationTrace of one rank's values, with each step's `Layout` on the world mesh.

    `placement(container_id)` is the layout; `logical(container_id)` the gathered whole value
    (collective: every rank calls it). Steps whose layout is unknown cannot be gathered: `logical`
    raises `LogicalCaptureError` naming the step and why.
    """

    kind = "logical trace"
    world: Any = None
    placements: dict
    _logical_cache: dict

    def placement(self, container_id: str) -> Layout:
        step = self.by_container(container_id)
        return self.placements[step.step]

    def logical(self, container_id: str) -> torch.Tensor:
        """The whole value of `container_id`, gathered from every rank (a collective)."""
        step = self.by_container(container_id)
        cached = self._logical_cache.get(step.step)
        if cached is not None:
            return cached
        layout = self.placements[step.step]
        if not layout.known:
            raise LogicalCaptureError(f"{container_id} ({step.out_var!r} in {step.block_path or 'the root'}) cannot be "
                                      f"gathered: {layout.describe()} ({layout.source}); give its root input a "
                                      f"placement with capture_logical(..., input_placements=...)")
        if step.value is None:
            raise LogicalCaptureError(f"{container_id} has no value to gather ({step.omitted}); capture it "
                                      "without that limit or keep= selector")
        value = gather(local_of(step.value), layout, self.world)
        self._logical_cache[step.step] = value
        return value

    def logical_trace(self) -> ActivationTrace:
        """Every step with its gathered value (a collective); unknown ones keep no value and say why."""
        steps = []
        for step in self.steps:
            layout = self.placements[step.step]
            value, omitted = None, step.omitted
            if layout.known and step.value is not None:
                value = self.logical(step.container_id)
            elif not layout.known:
                omitted = f"placement unknown: {layout.source}"
            shape = tuple(value.shape) if value is not None else tuple(step.tensor.shape)
            steps.append(TraceStep(step.step, step.container_id, step.description, step.slot_type, step.out_var,
                                   step.op_name, step.block_path,
                                   TensorContainer(shape=shape, dtype=step.tensor.dtype, value=value),
                                   frame_depth=step.frame_depth, omitted=omitted, edited=step.edited))
        return ActivationTrace(steps, root=self.root)

    def logical_dataframe(self) -> Any:
        """The DataFrame of `logical_trace()` (logical shapes and statistics) with `placement`,
        `local_shape`, `reduced` and `placement_source` columns (a collective)."""
        frame = self.logical_trace().to_dataframe()
        frame["placement"] = [self.placements[s.step].badge() for s in self.steps]
        frame["local_shape"] = [tuple(local_of(s.value).shape) if s.value is not None else tuple(s.tensor.shape)
                                for s in self.steps]
        frame["reduced"] = [self.placements[s.step].reduced for s in self.steps]
        frame["placement_source"] = [self.placements[s.step].source for s in self.steps]
        return frame

    def logical_histogram(self, container_id: str, bins: int = 40) -> Any:
        """`histogram_bins` of the gathered value (a collective)."""
        from ..traces.histograms import histogram_bins

        return histogram_bins(self.logical(container_id), bins=bins)


def gather(local: torch.Tensor, layout: Layout, world: Any) -> torch.Tensor:
    """The whole value from each rank's `local` part: the innermost mesh dim first."""
    value = local.detach()
    for index in reversed(range(len(layout.dims))):
        placement = layout.dims[index]
        if placement.kind == "replicate":
            continue
        group = world.get_group(index)
        if placement.kind == "shard":
            parts: list = [None] * dist.get_world_size(group)
            dist.all_gather_object(parts, value.contiguous(), group=group)
            value = torch.cat(parts, dim=placement.tensor_dim)
        elif placement.kind == "partial":
            ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
                   "avg": dist.ReduceOp.SUM}
            if placement.reduce_op not in ops:
                raise LogicalCaptureError(f"a partial {placement.reduce_op} cannot be gathered")
            value = value.clone()
            dist.all_reduce(value, op=ops[placement.reduce_op], group=group)
            if placement.reduce_op == "avg":
                value = value / dist.get_world_size(group)
        else:
            raise LogicalCaptureError(f"a value with an unknown placement cannot be gathered ({layout.describe()})")
    return value


def _coordinates(world: Any) -> dict[int, tuple[int, ...]]:
    """Global rank -> its coordinates on the world mesh."""
    grid = world.mesh
    return {int(grid[index].item()): index for index in itertools.product(*(range(n) for n in grid.shape))}


def _replicated_over(dim: int, digests: dict[int, Optional[str]], coords: dict[int, tuple]) -> bool:
    """True when ranks differing only in their coordinate on `dim` hold equal digests."""
    groups: dict[tuple, set] = {}
    for rank, digest in digests.items():
        key = coords[rank][:dim] + coords[rank][dim + 1:]
        groups.setdefault(key, set()).add(digest)
    return all(len(found) == 1 and None not in found for found in groups.values())


def _reasons(texts: list[str]) -> str:
    """Distinct reasons once each, with how many values gave each (a value computed from many failed
    ones would otherwise repeat one sentence per value: kilobytes per row of the widget's reply)."""
    counts: dict[str, int] = {}
    for text in texts:
        counts[text] = counts.get(text, 0) + 1
    return "; ".join(text if n == 1 else f"{text} ({n} values)" for text, n in counts.items())


def consolidate(recorder: LogicalRecorder, trace: LogicalTrace) -> None:
    """Compare the ranks' records (a collective) and write the checked layouts into `trace`."""
    world = recorder.world
    steps = trace.steps
    mine = {"ids": [s.container_id for s in steps], "numbers": [s.step for s in steps],
            "layouts": {n: (recorder.layouts[n].dims, recorder.layouts[n].source) for n in recorder.layouts},
            "digests": recorder.digests, "operands": recorder.operand_digests}
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    ranks = list(range(len(everyone)))
    for rank, theirs in zip(ranks, everyone):
        if theirs["ids"] != mine["ids"]:
            first = next((i for i, (a, b) in enumerate(zip(mine["ids"], theirs["ids"])) if a != b),
                         min(len(mine["ids"]), len(theirs["ids"])))
            raise LogicalCaptureError(f"rank {rank} captured other steps than rank {dist.get_rank()} (first difference "
                                      f"at position {first}: {theirs['ids'][first:first + 1]} vs "
                                      f"{mine['ids'][first:first + 1]}); every rank must run the same schema on "
                                      "inputs of the same structure")
    coords = _coordinates(world)
    failed: set = set()  # steps and operands assumed replicated that are not
    reasons: dict = {}
    for key in list(recorder.digests) + list(recorder.operand_digests):
        table = "digests" if isinstance(key, int) else "operands"
        digests = {rank: theirs[table].get(key) for rank, theirs in zip(ranks, everyone)}
        layout = recorder.layouts.get(key) if isinstance(key, int) else None
        assumed = recorder.operand_dims.get(key, range(world.ndim))
        for dim in assumed:
            if layout is not None and layout.dims[dim].kind != "replicate":
                continue  # a batch shard's other dims are the ones assumed
            if not _replicated_over(dim, digests, coords):
                failed.add(key)
                where = recorder.operand_names.get(key, f"step {key}")
                reasons[key] = f"{where} differs across mesh dim {recorder.names[dim]!r}"
    placements: dict[int, Layout] = {}
    for number, layout in recorder.layouts.items():
        agreed = all(theirs["layouts"].get(number, (None,))[0] == layout.dims for theirs in everyone)
        if not agreed:
            layout = Layout(tuple(UNKNOWN for _ in layout.dims), layout.mesh_dim_names,
                            "the ranks derived different placements for it")
        elif layout.assumes & failed:
            bad = sorted(layout.assumes & failed, key=str)
            if bad == [number]:
                dims = tuple(UNKNOWN if d.kind == "replicate" else d for d in layout.dims)
                layout = Layout(dims, layout.mesh_dim_names, f"not replicated: {reasons[number]}", layout.reduced)
            else:
                layout = Layout(tuple(UNKNOWN for _ in layout.dims), layout.mesh_dim_names,
                                "derived from values that are not replicated: " + _reasons([reasons[k] for k in bad]),
                                layout.reduced)
        elif layout.assumes:
            layout = Layout(layout.dims, layout.mesh_dim_names,
                            layout.source.replace("assumed replicated, checked after the run",
                                                  "replicated (equal on every rank)"), layout.reduced)
        placements[number] = layout
    trace.placements = placements
    trace.operand_failures = {recorder.operand_names[k]: reasons[k] for k in failed if isinstance(k, str)}


def _run(block: ModelBlockSchema, scope: dict, recorder: LogicalRecorder, listeners: tuple = ()) -> list:
    """The run: the runtime's entry for the root runs the root module's forward hooks around its
    schema, once, as `model(x)` would (FSDP2's root pre-forward hook unshards the root's own
    parameters; a tensor-parallel style on the root converts its inputs). `listeners` hear each
    instruction after the recorder (distributed/diverge.py keys its rows to the recorder's steps)."""
    model = block.module
    if model is not None and (model._backward_hooks or model._backward_pre_hooks):
        raise LogicalCaptureError(f"{block.name} has module backward hooks, which need the real module call; "
                                  "capture_logical runs the schema and cannot run them around it")
    return SchemaInterpreter(listeners=[recorder, *listeners]).run(block=block, scope=scope)


def capture_logical(block: ModelBlockSchema, scope: dict, mesh: Any = None, input_placements: Optional[dict] = None,
                    keep: Any = None, limits: Any = None) -> ExecutionRecord:
    """Run `block` on this rank's `scope` and record every value with its placement (a collective).

    Every rank of the default process group calls it with its own inputs. `mesh` is the DeviceMesh
    placements refer to (found on the model's DTensor parameters and parallel styles when omitted;
    give the 2-D mesh for FSDP2 x TP). `input_placements` maps root input names to one torch
    placement per mesh dim (`{"x": [Shard(0), Replicate()]}`); without it an FSDP2 model's inputs are
    batch shards (`Shard(0)`) over its data-parallel dims and any other input is checked to be
    replicated. Returns an `ExecutionRecord` whose `trace` is a `LogicalTrace`.
    """
    return logical_capture(block, scope, mesh, input_placements, keep=keep, limits=limits)


def logical_capture(block: ModelBlockSchema, scope: dict, mesh: Any, input_placements: Optional[dict], *,
                    keep: Any = None, limits: Any = None, recorder_class: type = LogicalRecorder,
                    listeners: tuple = ()) -> ExecutionRecord:
    """`capture_logical` with a recorder class of the caller's (a `LogicalRecorder` subclass) and
    more `listeners` heard after the recorder in the same run."""
    if not dist.is_available() or not dist.is_initialized():
        raise LogicalCaptureError("capture_logical needs an initialised process group (torch.distributed."
                                  "init_process_group, or torchrun); in one process, use capture_run")
    model = block.module
    if mesh is None:
        mesh = find_world_mesh(model) if model is not None else None
        if mesh is None:
            raise LogicalCaptureError("no DeviceMesh found on the model (no DTensor parameter, no parallel style); pass "
                                      "capture_logical(..., mesh=init_device_mesh(...))")
    if mesh.size() != dist.get_world_size():
        raise LogicalCaptureError(f"the mesh has {mesh.size()} ranks and the process group {dist.get_world_size()}; "
                                  "capture_logical needs one mesh over the whole group")
    if mesh.ndim > 1 and not mesh.mesh_dim_names:
        raise LogicalCaptureError("a mesh of more than one dimension needs mesh_dim_names "
                                  "(init_device_mesh('cpu', (2, 2), mesh_dim_names=('dp', 'tp')))")
    batch_dims = tuple(fsdp_mesh_dims(mesh, model)) if model is not None else ()
    recorder = recorder_class(mesh, input_placements, batch_dims, keep=keep, limits=limits)
    collecting = gc.isenabled()
    if collecting:
        gc.disable()
    try:
        outputs = _run(block, scope, recorder, tuple(listeners))
    finally:
        if collecting:
            gc.enable()
    trace = recorder.trace
    trace.__class__ = LogicalTrace  # the recorder built an ActivationTrace; this one adds the layouts
    trace.world = mesh
    trace._logical_cache = {}
    trace.mesh_dim_names = _dim_names(mesh)
    consolidate(recorder, trace)
    return ExecutionRecord(outputs=outputs, trace=trace, scope=_root_scope(block, scope, recorder.root_frame),
                           recorder=recorder)
