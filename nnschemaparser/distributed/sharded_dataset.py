"""`capture_sharded_dataset`: an activation store from a sharded model, written as one process would.

A tensor-parallel or FSDP2 model cannot be captured by `capture_dataset`'s split of the inputs over
ranks: every rank must run every input, since the forward itself is a collective. Here every rank
of the default group iterates the same inputs; each input runs under `capture_logical`, every step
is gathered whole on the fly (`LogicalTrace.logical_trace`: shards concatenated, partial sums
all-reduced), and rank 0 writes the whole values (`store.dataset.write_gathered`); the other ranks
write nothing. The store is the store of one process: its statistics, kept tensors and reductions
are of the logical values, and it is read by `TraceStore` as any other.

Decisions:

- gathered on the fly, not shards written with their placement: a reader then needs no mesh, and
  the store's statistics (computed per step, of every step) are of whole values;
- every rank is given the same inputs (checked, by digest, per input): the root inputs are
  replicated on every mesh dim, also under FSDP2 (its ranks then run the same rows);
- a value with an unknown placement stops the capture (`LogicalCaptureError` naming it): never a
  store of one rank's shard under a whole value's name.

Values computed from a sum over shards (a row-parallel output and what follows it) are the ranks'
terms added in another order than one process adds them: they may differ from a one-process store in
the last bits (`compare_logical` says which and by how much); every other value is `torch.equal`.

Depends on `logical`, `recorder`, `placement` and store.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any, Iterable, Optional

import torch
import torch.distributed as dist

from ..schema.model import ModelBlockSchema
from ..store.dataset import write_gathered
from .logical import LogicalCaptureError, capture_logical
from .placement import find_world_mesh
from .recorder import digest

__all__ = ["capture_sharded_dataset"]


def _same_inputs(scope: dict) -> None:
    """Every rank was given this input (a collective): a digest per root tensor, compared."""
    mine = {name: digest(value) for name, value in scope.items() if isinstance(value, torch.Tensor)}
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    for rank, theirs in enumerate(everyone):
        if theirs != mine:
            differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            raise LogicalCaptureError(f"rank {rank} was given other inputs than rank {dist.get_rank()} ({differ}); "
                                      "capture_sharded_dataset needs every rank to iterate the same inputs")


def _gathered_run(mesh: Any) -> Any:
    from torch.distributed.tensor.placement_types import Replicate

    def run(schema: ModelBlockSchema, scope: dict, interventions: Any = None) -> Any:
        _same_inputs(scope)
        placements = {name: [Replicate()] * mesh.ndim for name, value in scope.items()
                      if isinstance(value, torch.Tensor)}
        record = capture_logical(schema, scope, mesh=mesh, input_placements=placements)
        trace = record.trace
        unknown = [s for s in trace.steps if not trace.placement(s.container_id).known]
        if unknown:
            step = unknown[0]
            raise LogicalCaptureError(f"{len(unknown)} values have no placement, so they cannot be gathered into the "
                                      f"store; the first: {step.container_id} ({step.out_var!r} in "
                                      f"{step.block_path or 'the root'}): {trace.placement(step.container_id).source}")
        return SimpleNamespace(outputs=record.outputs, trace=trace.logical_trace())

    return run


def capture_sharded_dataset(schema: ModelBlockSchema, inputs: Iterable[Any], store: str | os.PathLike, keep: Any = None,
                            *, mesh: Any = None, block_size: int = 64, shard_bytes: int = 256 * 1024 * 1024,
                            bins: int = 64, low: float = -8.0, high: float = 8.0, top_k: int = 16,
                            progress: bool = True, limits: Any = None, batch_axis: Optional[int] = 0,
                            mask: Any = None) -> Any:
    """`capture_dataset` for a model sharded over the ranks of the default process group (tensor
    parallel, transformers' `tp_plan="auto"`, FSDP2): call it on every rank (torchrun) with the same
    `inputs`. Each value is gathered whole on the fly and rank 0 writes the store one process would
    (module docstring); every rank returns the TraceStore. Options as for `capture_dataset`; `mesh`
    as for `capture_logical` (found on the model when omitted). Resuming works as there: inputs
    already committed are skipped by every rank."""
    if not dist.is_available() or not dist.is_initialized():
        raise LogicalCaptureError("capture_sharded_dataset needs an initialised process group (torchrun, or "
                                  "torch.distributed.init_process_group); for a model in one process, use "
                                  "capture_dataset")
    if mesh is None:
        mesh = find_world_mesh(schema.module) if schema.module is not None else None
        if mesh is None:
            raise LogicalCaptureError("no DeviceMesh found on the model (no DTensor parameter, no parallel style); "
                                      "pass capture_sharded_dataset(..., mesh=init_device_mesh(...))")
    return write_gathered(store, schema, inputs, _gathered_run(mesh), keep, block_size=block_size,
                          shard_bytes=shard_bytes, bins=bins, low=low, high=high, top_k=top_k, progress=progress,
                          limits=limits, batch_axis=batch_axis, mask=mask)
