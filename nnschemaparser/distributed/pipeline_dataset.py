"""`capture_pipeline_dataset`: an activation store from a model split into pipeline stages, as one process writes it.

Each rank holds one stage: a `SchemaStage` (manual stages, `distributed/pipeline.py`) under a
`PipelineStage` and a single-stage schedule (`ScheduleGPipe`, `Schedule1F1B`). Every rank iterates the
same inputs (checked by digest, per input); for each, the schedule runs the batch in micro-batches,
each stage capturing every step of each call, and then:

1. each rank joins its stage's micro-batches into the batch's values: a value whose first axis has
   each micro-batch's rows is concatenated in micro-batch order (the schedule's `tensor_split` is
   contiguous, so row r of the join is row r of the batch: the store's sample ids are the batch's
   rows); any other value (a [1, T, d] rotary table, a scalar) must be `torch.equal` in every
   micro-batch and is kept once;
2. the stage's block paths become the whole model's (`paths=`: the whole model, whose sub-modules the
   stage holds, mapped by identity; or a dict of path prefixes; or None when they are already), so
   `layers.3:output` names the same value whichever rank ran layer 3;
3. the joined steps go to rank 0 (`gather_object`), which writes them in stage order through the
   store's own writer (`store.dataset.write_gathered`): statistics, kept tensors and reductions of
   the batch's rows, as `capture_dataset` of the unsplit model writes them.

What the store holds, per input: the first stage's inputs (the root inputs, kept whole), every step
inside a sub-block of the model, and each sub-block call's result where the stage binds it (the
`X:output` names). A stage's own root code is glue written for the split (its loop over its share of
the layers, what it hands to the next stage): its other steps, and the model root's own variables
and output, which no stage runs as the unsplit model does, are not in the store. Step numbers and
container ids are the store's own (counted over the stages); names are the unsplit model's.

Decisions:

- sent to the writing rank, not written per rank and merged on read: the store is then an ordinary
  store (a reader needs no stage map), and rank 0 holds one input's values at a time, as one process
  capturing that input does;
- the store's identity (manifest) is the stages': their schemas' hashes, where their blocks sit in
  the model, their weights under the model's names; so a pipeline store resumes only with the same
  split (however `paths=` describes it);
- refused: several stages on one rank, stages with `PlacedEdit`s (the manifest could not say the
  store holds edited runs), micro-batches of one row each (a [1, ...] value could be a row or a
  broadcast), steps that differ between micro-batches (data-dependent control flow), and a value
  that differs between micro-batches without a row axis.

Bit-equality with one process holds when a micro-batch's rows compute as they do in the whole batch
(per-row ops; one torch thread on each side, as the store's other parallel writers ask).

Depends on `pipeline`, `sharded_dataset` (the same-inputs check), traces and store.
"""

from __future__ import annotations

import hashlib
import json
import os
from types import SimpleNamespace
from typing import Any, Iterable, Optional

import torch
import torch.distributed as dist
from torch import nn

from ..schema.model import ModelBlockSchema, TensorContainer
from ..store.dataset import write_gathered
from ..store.manifest import SchemaIdentity, schema_identity
from ..traces.selection import BLOCK_CALL_PREFIXES
from ..traces.trace import ActivationTrace, TraceStep
from .logical import LogicalCaptureError
from .pipeline import SchemaStage
from .sharded_dataset import _same_inputs

__all__ = ["capture_pipeline_dataset"]


class _PathMap:
    """A stage's block paths as the whole model's (see the module docstring, `paths=`)."""

    def __init__(self, stage: SchemaStage, paths: Any):
        self.stage = stage
        self.prefixes: dict[str, str] = {}
        self.root_name = stage.schema.name
        self.strict = False
        if isinstance(paths, nn.Module):
            where = {id(module): name for name, module in paths.named_modules(remove_duplicate=False)}
            for name, module in stage.module.named_modules(remove_duplicate=False):
                if name and id(module) in where:
                    self.prefixes[name] = where[id(module)]
            self.root_name, self.strict = type(paths).__name__, True
        elif isinstance(paths, dict):
            for key, value in paths.items():
                if not isinstance(key, str) or not isinstance(value, str) or not value:
                    raise LogicalCaptureError(f"paths= maps stage block paths to the model's ({{'layers.0': "
                                              f"'layers.2'}}, '' to the model root's name): strings, the model's "
                                              f"not empty; got {key!r}: {value!r}")
                if key:
                    self.prefixes[key] = value
                else:
                    self.root_name = value
        elif paths is not None:
            raise LogicalCaptureError(f"paths= is the whole model (an nn.Module holding the stage's modules), a dict "
                                      f"of path prefixes, or None (the stage's paths are the model's); got "
                                      f"{type(paths).__name__}")
        self.blocks = {block.path for block in stage.schema.iter_blocks() if block.path}
        self.done: dict[str, str] = {}

    def __call__(self, path: str) -> str:
        mapped = self.done.get(path)
        if mapped is not None:
            return mapped
        parts = path.split(".")
        for cut in range(len(parts), 0, -1):
            head = ".".join(parts[:cut])
            if head in self.prefixes:
                mapped = ".".join([self.prefixes[head]] + parts[cut:])
                break
        else:
            if self.strict:
                raise LogicalCaptureError(
                    f"{self.stage.stage_name}: its block {path!r} is no sub-module of the model given as paths= (the "
                    "stage must hold the model's own modules); pass paths={stage path: model path} instead")
            mapped = path
        self.done[path] = mapped
        return mapped

    def is_root(self, block_path: str) -> bool:
        return block_path not in self.blocks


def _rows(scope: dict) -> int:
    """The rows the schedule splits the batch into micro-batches along (dim 0 of the tensor inputs)."""
    sizes = {name: int(v.shape[0]) for name, v in scope.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
    if len(set(sizes.values())) != 1:
        raise LogicalCaptureError(f"the schedule splits every tensor input along dim 0 into micro-batches, but the "
                                  f"inputs' first dims are {sizes}: give inputs of one batch size")
    return sizes.popitem()[1]


def _join(values: list, sizes: list[int], where: str) -> Any:
    """The batch's value of one step from each micro-batch's (module docstring, point 1)."""
    first = values[0]
    if first is None or not isinstance(first, torch.Tensor):
        if any(v is not None for v in values):
            raise LogicalCaptureError(f"{where} was captured in some micro-batches only")
        return None
    if all(v.dim() > 0 and v.shape[0] == n for v, n in zip(values, sizes)):
        return torch.cat(values, 0)
    if all(v.shape == first.shape and v.dtype == first.dtype and torch.equal(v, first) for v in values[1:]):
        return first
    raise LogicalCaptureError(f"{where} differs between micro-batches ({[list(v.shape) for v in values]}) but has no "
                              f"first axis of the micro-batches' rows {sizes}: it cannot be joined into the batch's "
                              "value. A pipeline store needs values that are per row or the same for every row")


def _stage_steps(stage: SchemaStage, sizes: list[int], paths: _PathMap) -> list[tuple]:
    """This rank's steps of one input: (description, slot, var, op, block, value, depth), micro-batches joined."""
    captures = sorted(stage.captures, key=lambda c: c.call)
    if [c.microbatch for c in captures] != list(range(len(sizes))):
        raise LogicalCaptureError(
            f"{stage.stage_name} was called {len(captures)} times for an input the schedule split into {len(sizes)} "
            "micro-batches; give PipelineStage the micro-batch's input_args and output_args (so it runs no call of "
            "its own to infer shapes) and SchemaStage(microbatches=) the schedule's n_microbatches")
    traces = [c.trace.steps for c in captures]
    keys = [[(s.slot_type, s.block_path, s.out_var, s.op_name) for s in steps] for steps in traces]
    for index, other in enumerate(keys[1:], 1):
        if other != keys[0]:
            at = next((i for i, (a, b) in enumerate(zip(keys[0], other)) if a != b), min(len(other), len(keys[0])))
            raise LogicalCaptureError(f"{stage.stage_name}: micro-batch {index} ran other steps than micro-batch 0 "
                                      f"(from step {at}: data-dependent control flow); its values cannot be joined "
                                      "into the batch's. Capture this model in one process (capture_dataset)")
    out = []
    first = stage.stage_index == 0
    for i, step in enumerate(traces[0]):
        root = paths.is_root(step.block_path)
        call = step.slot_type == "activation" and step.description.startswith(BLOCK_CALL_PREFIXES)
        if root and not (call or first and step.slot_type == "input"):
            continue  # the stage's glue: not a step of the unsplit model (module docstring)
        where = f"{stage.stage_name}'s {step.block_path or 'root'}:{step.out_var} (step {step.step})"
        value = _join([steps[i].value for steps in traces], sizes, where)
        block, op, description = step.block_path, step.op_name, step.description
        if call and op:
            mapped = paths(op)
            description = description.replace(op, mapped, 1)
            op = mapped
        block = ("" if step.slot_type == "input" else paths.root_name) if root else paths(block)
        out.append((description, step.slot_type, step.out_var, op, block, value, step.frame_depth))
    return out


def _identity(everyone: list) -> SchemaIdentity:
    """The store's identity from every stage's (module docstring, decisions)."""
    digest = hashlib.sha256()
    weights: list = []
    for item in everyone:
        digest.update(json.dumps([item["index"], item["hash"], item["blocks"]]).encode("utf-8"))
        weights.extend(item["weights"] or ())
    first = everyone[0]
    return SchemaIdentity(digest.hexdigest(), f"pipeline of {len(everyone)} stages of {first['root']}",
                          tuple(first["inputs"]), tuple(sorted(set(weights))))


def _described(stage: SchemaStage, paths: _PathMap, microbatches: Optional[int]) -> dict:
    own = schema_identity(stage.schema)
    weights = [(paths(name.rpartition(".")[0]) + "." + name.rpartition(".")[2] if "." in name else name, *rest)
               for name, *rest in own.weights or ()]
    problems = []
    if stage.edits:
        problems.append(f"{stage.stage_name} has PlacedEdits: a store cannot record them; capture without edits")
    if microbatches is not None and microbatches != stage.microbatches:
        problems.append(f"{stage.stage_name} counts {stage.microbatches} micro-batches (SchemaStage(microbatches=)) "
                        f"but the schedule makes {microbatches}; give both the same")
    blocks = sorted(paths(path) for path in paths.blocks)  # where its blocks sit in the model, however paths= said it
    return {"index": stage.stage_index, "hash": own.source_hash, "blocks": blocks, "root": paths.root_name,
            "inputs": list(own.inputs), "weights": weights, "problems": problems}


def _as_dicts(inputs: Iterable[Any], names: list[str]) -> Iterable[dict]:
    """Each input as a scope of the first stage's arguments (a tensor or tuple by position)."""
    for item in inputs:
        if isinstance(item, torch.Tensor):
            item = (item,)
        if isinstance(item, (tuple, list)):
            if len(item) > len(names):
                raise TypeError(f"an input of {len(item)} values, but the first stage takes {len(names)} "
                                f"({', '.join(names)}); give each input as a dict of them")
            item = dict(zip(names, item))
        elif hasattr(item, "keys") and not isinstance(item, dict):
            item = {key: item[key] for key in item.keys()}
        yield item


class _Sized:
    """The scopes of inputs that have a length, with it (the progress bar's total)."""

    def __init__(self, items: Iterable[Any], size: int):
        self.items, self.size = items, size

    def __iter__(self):
        return iter(self.items)

    def __len__(self) -> int:
        return self.size


def capture_pipeline_dataset(stage: SchemaStage, schedule: Any, inputs: Iterable[Any], store: str | os.PathLike,
                             keep: Any = None, *, paths: Any = None, block_size: int = 64,
                             shard_bytes: int = 256 * 1024 * 1024, bins: int = 64, low: float = -8.0,
                             high: float = 8.0, top_k: int = 16, progress: bool = True, limits: Any = None,
                             batch_axis: Optional[int] = 0, mask: Any = None) -> Any:
    """`capture_dataset` for a model split into pipeline stages, one per rank of the default process group:
    call it on every rank with the rank's `SchemaStage` (the module under its `PipelineStage`), the
    single-stage `schedule` (`ScheduleGPipe(pipeline_stage, n_microbatches)`) and the same `inputs`. The
    schedule runs each input in micro-batches; rank 0 writes the store `capture_dataset` of the unsplit
    model writes, its values `torch.equal` to it, under the same names (module docstring: what it holds and
    what is refused). `paths` says where the stage's modules sit in the whole model: the whole model itself
    (an `nn.Module` whose sub-modules the stage holds), a dict of path prefixes (`{"layers.0": "layers.2"}`),
    or None (the stage's paths are the model's). `keep` names the whole model's paths. Other options as for
    `capture_dataset`; every rank returns the TraceStore. The stage's captures are reset for each input."""
    if not dist.is_available() or not dist.is_initialized():
        raise LogicalCaptureError("capture_pipeline_dataset needs an initialised process group (torchrun, or "
                                  "torch.distributed.init_process_group) with one stage per rank; for a model in one "
                                  "process, use capture_dataset")
    mine: dict = {"index": getattr(stage, "stage_index", -1), "problems": []}
    mapping: Optional[_PathMap] = None
    try:  # what one rank finds wrong is said on every rank (below), so none waits in a collective for it
        if not isinstance(stage, SchemaStage):
            raise LogicalCaptureError(f"stage must be the rank's SchemaStage (the module given to PipelineStage), got "
                                      f"{type(stage).__name__}; wrap the stage's module: SchemaStage(module, schema, "
                                      "index)")
        pipeline_stage = getattr(schedule, "_stage", None)
        if pipeline_stage is None or getattr(pipeline_stage, "submod", None) is not stage:
            raise LogicalCaptureError("schedule must be a single-stage schedule (ScheduleGPipe, Schedule1F1B) of a "
                                      "PipelineStage made of this SchemaStage; schedules of several stages per rank "
                                      "(interleaved, looped) are not supported")
        mapping = _PathMap(stage, paths)
        mine = _described(stage, mapping, getattr(schedule, "_n_microbatches", None))
    except LogicalCaptureError as exc:
        mine["problems"].append(f"rank {dist.get_rank()}: {exc}")
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    everyone.sort(key=lambda item: item["index"])
    problems = [p for item in everyone for p in item["problems"]]
    if not problems and [item["index"] for item in everyone] != list(range(len(everyone))):
        problems.append(f"the ranks hold stages {[item['index'] for item in everyone]}: give each rank one stage, "
                        "0 to world size - 1")
    if problems or mapping is None:
        raise LogicalCaptureError("capture_pipeline_dataset: " + "; ".join(problems))
    identity = _identity(everyone)
    mapping.root_name = everyone[0]["root"]  # every stage's calls are the model root's, named as stage 0 names it
    count = stage.microbatches

    def run(schema: ModelBlockSchema, scope: dict, interventions: Any = None) -> Any:
        _same_inputs(scope)
        rows = _rows(scope)
        sizes = [len(part) for part in torch.arange(rows).tensor_split(count)]
        if max(sizes) < 2:
            raise LogicalCaptureError(f"an input of {rows} rows in {count} micro-batches gives micro-batches of one "
                                      "row, in which a [1, ...] value may be a row or a broadcast one: give inputs of "
                                      "at least 2 rows per micro-batch")
        capture, kept = stage.capture, stage.keep
        stage.capture, stage.keep = True, None
        stage.reset()
        failure, error = "", None
        try:
            output = schedule.eval(**scope) if stage.stage_index == 0 else schedule.eval()
            payload = (stage.stage_index, _stage_steps(stage, sizes, mapping),
                       output if stage.stage_index == len(everyone) - 1 else None)
        except Exception as exc:  # noqa: BLE001 - said on every rank below, so none waits for this one
            failure, payload, error = f"{type(exc).__name__}: {exc}", None, exc
        finally:
            stage.capture, stage.keep = capture, kept
            stage.reset()
        failures: list = [None] * len(everyone)
        dist.all_gather_object(failures, (stage.stage_index, failure))
        failed = [f"stage {index}: {text}" for index, text in sorted(failures) if text]
        if failed:
            raise LogicalCaptureError("capture_pipeline_dataset: " + "; ".join(failed)) from error
        gathered: Optional[list] = [None] * len(everyone) if dist.get_rank() == 0 else None
        dist.gather_object(payload, gathered, dst=0)
        if gathered is None:
            return SimpleNamespace(outputs=None, trace=None)
        steps, outputs = [], None
        for _, records, last in sorted(gathered, key=lambda item: item[0]):
            outputs = last if last is not None else outputs
            for description, slot, var, op, block, value, depth in records:
                number = len(steps) + 1
                cid = f"{(slot if slot != 'activation' else block).replace('.', '_')}_{number:04d}"
                shape = tuple(value.shape) if value is not None else ()
                dtype = str(value.dtype) if value is not None else ""
                steps.append(TraceStep(number, cid, description, slot, var, op, block,
                                       TensorContainer(shape, dtype, value, cid, slot), None, depth))
        return SimpleNamespace(outputs=outputs, trace=ActivationTrace(steps, root=mapping.root_name))

    names = everyone[0]["inputs"]
    scopes = _as_dicts(inputs, names)
    if hasattr(inputs, "__len__"):
        scopes = _Sized(scopes, len(inputs))  # type: ignore[arg-type]
    return write_gathered(store, stage.schema, scopes, run, keep, block_size=block_size, shard_bytes=shard_bytes,
                          bins=bins, low=low, high=high, top_k=top_k, progress=progress, limits=limits,
                          batch_axis=batch_axis, mask=mask, identity=identity)
