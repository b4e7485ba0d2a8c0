"""The parts of `diverge_logical` that know about shards: rows keyed to the logical capture's steps,
a's value cut to this rank's part by a recorded placement, and b's weights gathered whole.

- `StepRecorder`: a `LogicalRecorder` that also remembers which step number each tensor it recorded
  got, so a row (a tensor bound to a source name) finds its placement after the run.
- `ShardRows`: the `RowListener` of b's two runs. Rows are keyed as a's are (the sharded model runs
  the reference's code: same file, line and variable), so one key names a row on both sides.
  `"free"`: keep this rank's part of each row and its step number (and whether a sum over shards
  happened inside its statement); `"force"`: keep the part (`L`), then bind, in its place, the
  part of a's value (cast to the part's dtype) that this rank holds under the row's placement.
- `shard_of`: that part. A shard is a `torch.chunk` of the value along its tensor dim (as DTensor
  cuts it), outermost mesh dim first (the inverse of `logical.gather`); a partial sum is the value on
  coordinate 0 and zeros elsewhere, so the all-reduce gives a's value exactly; a partial avg, max or
  min, and a replica, are the value itself.
- `whole_weights`: every parameter and buffer of the sharded model as one process holds it
  (`DTensor.full_tensor`, a collective).

Depends on traces (`diverge_runs`) and `placement`; never on views.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..schema.model import Instruction
from ..traces.diverge_runs import RowListener
from .placement import Layout, is_dtensor, local_of
from .recorder import LogicalRecorder

__all__ = ["StepRecorder", "ShardRows", "shard_of", "whole_weights", "WeightsOf"]


class StepRecorder(LogicalRecorder):
    """A `LogicalRecorder` that maps each recorded tensor to its step number (`number_of`)."""

    def _reset_logical(self) -> None:
        super()._reset_logical()
        self.number_of: dict[int, tuple[torch.Tensor, int]] = {}

    def _add(self, tensor: torch.Tensor, slot_type: str, description: str, out_var: str, op_name: str,
             block_path: str, depth: int) -> None:
        super()._add(tensor, slot_type, description, out_var, op_name, block_path, depth)
        self.last_added = (tensor, self._count)
        entry = self.number_of.get(id(tensor))
        if entry is None or entry[0] is not tensor:  # a tensor recorded again (bound by the caller) keeps its first step
            self.number_of[id(tensor)] = (tensor, self._count)

    def step_of(self, tensor: Any) -> Optional[int]:
        entry = self.number_of.get(id(tensor))
        return entry[1] if entry is not None and entry[0] is tensor else None

    def sums_in(self, number: int) -> bool:
        """Whether step `number` is where a sum over shards happens: a partial sum, or what a
        row-parallel style's output hook all-reduced."""
        layout = self.layouts.get(number)
        return layout is not None and (layout.partial or (layout.reduced and "RowwiseParallel" in layout.source))


class ShardRows(RowListener):
    """b's rows in a sharded run (see the module docstring); `mode` is "free" or "force"."""

    def __init__(self, mode: str, store: dict, world: Any, roots: tuple[str, str] = ("", "")):
        super().__init__("a", "keep", None, store)  # keyed as a's rows: the same code runs on both sides
        self.mode, self.world = mode, world
        self.recorder: Optional[StepRecorder] = None
        # the root's path is its class name: FSDP2's `FSDPBlock` is the reference's `Block`
        self.rename = {roots[0]: roots[1]} if roots[0] != roots[1] else {}
        self.table = "B" if mode == "free" else "Lpart"  # this rank's parts, in store[table]
        self.steps: dict[tuple, Optional[int]] = {}
        self.sums: dict[tuple, bool] = {}
        self.layouts: dict[tuple, Layout] = {}  # force: each row's placement from the free run
        self.not_forced: dict[tuple, str] = {}
        self._pending: dict[int, bool] = {}  # free: id(frame) -> a sum over shards since its last row
        self._seen, self._new = 0, range(0)

    def on_instruction(self, event: Any) -> None:
        recorder = self.recorder
        if recorder is not None and self.mode == "free":  # the steps the recorder took at this instruction
            new = range(self._seen + 1, recorder._count + 1)
            self._seen = recorder._count
            if any(recorder.sums_in(n) for n in new):
                self._pending[id(event.frame)] = True
            self._new = new
        super().on_instruction(event)

    def _step(self, value: torch.Tensor) -> Optional[int]:
        """The step `value` was recorded as at this instruction, else the first step it was recorded as."""
        added = getattr(self.recorder, "last_added", None)
        if added is not None and added[0] is value and added[1] in self._new:
            return added[1]
        return self.recorder.step_of(value)

    def _row(self, instr: Instruction, var: str, value: torch.Tensor, frame: dict, path: str) -> Optional[torch.Tensor]:
        key = self._register(instr, var, value, self.rename.get(path, path))
        if key is None:
            return None
        self._keep(self.table, key, local_of(value).detach())
        if self.mode == "free":
            self.steps[key] = self._step(value) if self.recorder is not None else None
            self.sums[key] = self._pending.pop(id(frame), False)
            return None
        if value.is_floating_point():
            self.store.setdefault("dtype", {})[key] = self.store["precision"]
        layout = self.layouts.get(key)
        whole = self.store.get("A", {}).get(key)
        if layout is None or not layout.known or whole is None:
            self.not_forced[key] = "no placement from the free run" if layout is None or not layout.known else \
                "a's run has no such row"
            return None
        cast = whole.to(device=value.device, dtype=value.dtype)
        if cast is not whole:
            self.store["A"][key] = cast  # the replay is forced with the same cast value
        part = shard_of(cast, layout, self.world)
        local = local_of(value)
        if part is None or tuple(part.shape) != tuple(local.shape):
            self.not_forced[key] = (f"a's value {tuple(cast.shape)} cut by {layout.badge()} is not this rank's part "
                                    f"{tuple(local.shape)}")
            return None
        if is_dtensor(value):
            from torch.distributed.tensor import DTensor

            return DTensor.from_local(part, value.device_mesh, value.placements, run_check=False,
                                      shape=value.shape, stride=value.stride())
        return part


def shard_of(whole: torch.Tensor, layout: Layout, world: Any) -> Optional[torch.Tensor]:
    """The part of `whole` this rank holds under `layout` on the mesh `world` (None: cannot be cut)."""
    value = whole
    for index, placement in enumerate(layout.dims):  # outermost first: `gather` joins innermost first
        if placement.kind == "replicate":
            continue
        size, coordinate = world.size(index), world.get_local_rank(index)
        if placement.kind == "shard":
            parts = torch.chunk(value, size, dim=placement.tensor_dim)
            if len(parts) != size:
                return None
            value = parts[coordinate]
        elif placement.kind == "partial":
            if placement.reduce_op == "sum" and coordinate != 0:
                value = torch.zeros_like(value)
            elif placement.reduce_op not in ("sum", "avg", "max", "min"):
                return None
        else:
            return None
    return value.contiguous()


def whole_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """{name: whole tensor} of `model`'s parameters and buffers (a collective for DTensor ones:
    every rank calls it, and `named_parameters` lists them in the same order on every rank)."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if is_dtensor(tensor):
            tensor = tensor.full_tensor()
        out[name] = tensor.detach()
    return out


class WeightsOf:
    """Named tensors read as a model's (what `diverge_runs.replay_weights` reads of model b)."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors

    def named_parameters(self) -> list:
        return list(self.tensors.items())

    def named_buffers(self) -> list:
        return []
