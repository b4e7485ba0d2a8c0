"""`LogicalRecorder`: an `ActivationRecorder` that also works out each captured value's placement.

Per step, and per dimension of the world mesh, the layout comes from the first rule that applies:

1. the value is a DTensor: its own placements (for the mesh dims its mesh covers);
2. it is what a sub-block call returned: the tensor-parallel style on that module says what its
   output hook made of it (ColwiseParallel: `Shard(-1)`, RowwiseParallel: `Replicate` after a sum);
   the dims the style does not cover keep the layout of what the callee returned, when the hook
   left it the same values;
3. it is an op's result: the op runs once more on its operands wrapped as DTensors of that mesh
   dimension (`DTensor.from_local`, their layouts as recorded), so DTensor's own sharding rules say
   where the result lies; the layout is kept only when the DTensor result's local part is
   `torch.equal` to the value the rank computed (otherwise: unknown). The second run leaves the
   first one's world as it was: it gets copies of the operands' local parts (an in-place op does not
   write the rank's tensors twice), the RNG state is put back after it (a random op does not move
   the stream), and a method of an object (a KV cache's `update`) runs on a deep copy of the object;
   an nn.Module passed in or called is the real one;
4. nothing applies (a fresh tensor, operands never seen, a root input): assumed replicated and
   checked after the run, when every rank compares the digests of its values (`consolidate`).

An op that returns a tuple or list of tensors (`q, k = apply_rotary_pos_emb(q, k, cos, sin)`) is
not a step, but its parts get layouts the same way (rule 3, per part: the DTensor result's part
compared with the rank's), so what is unpacked from it is found again by identity.

Operands that are parameters or buffers read during the forward (FSDP2's unsharded weights, a
norm's weight under tensor parallelism) are assumed replicated the same way and checked the same
way. A layout derived from an assumption that fails the check becomes unknown.

Depends on traces (the recorder it extends), runtime (operand reading) and `placement`.
"""

from __future__ import annotations

import copy
import hashlib
import types
from typing import Any, Optional

import torch

from ..runtime.instructions import operand_reader
from ..runtime.listeners import RETURN_SLOT
from ..schema.model import BlockInstruction, Instruction, ModelBlockSchema, OpInstruction, VarRef
from ..traces.recorder import ActivationRecorder
from .attention_rule import ensure_cpu_attention_rule
from .batch_rule import batch_rows_dims, copy_callable
from .placement import (REPLICATE, UNKNOWN, DimPlacement, Layout, _dim_names, dim_placement, fill_single_rank,
                        is_dtensor, layout_of_dtensor, local_of, style_output_layout)

__all__ = ["LogicalRecorder", "digest"]


def digest(tensor: torch.Tensor) -> str:
    """A digest of the bytes, shape and dtype a rank holds (equal digests: equal values)."""
    local = local_of(tensor).detach()
    if local.device.type != "cpu":
        local = local.cpu()
    # a copy: `numpy()` on the tensor itself would mark its storage as not resizable, and FSDP2
    # frees an unsharded parameter's storage by resizing it after the forward
    local = local.clone(memory_format=torch.contiguous_format)
    data = local.view(torch.uint8) if local.numel() and local.dtype != torch.bool else local.to(torch.uint8)
    sha = hashlib.sha1(f"{tuple(local.shape)}|{local.dtype}".encode())
    sha.update(data.numpy().tobytes())
    return sha.hexdigest()


def _view_key(tensor: torch.Tensor) -> tuple:
    try:
        return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                tuple(tensor.stride()), tensor.dtype)
    except (RuntimeError, NotImplementedError):  # a tensor without storage (a subclass, meta)
        return (id(tensor),)


class LogicalRecorder(ActivationRecorder):
    """Records a run like `ActivationRecorder` and a `Layout` per step in `layouts` (by step number).

    `world` is the DeviceMesh the layouts refer to; `input_placements` maps root input names to a
    torch placement per mesh dim (a sequence) or a Layout; `batch_dims` are the mesh dims whose ranks
    hold different batches of the root inputs (FSDP2's data-parallel dims: `Shard(0)` there).
    """

    def __init__(self, world: Any, input_placements: Optional[dict] = None, batch_dims: tuple = (), **kwargs: Any):
        super().__init__(**kwargs)
        ensure_cpu_attention_rule()  # DTensor has no rule for CPU attention: rule 3 could not follow it
        self.world = world
        self.names = _dim_names(world)
        self.input_placements = dict(input_placements or {})
        self.batch_dims = tuple(batch_dims)
        self._reset_logical()

    def _reset_logical(self) -> None:
        self.layouts: dict[int, Layout] = {}
        self.digests: dict[int, str] = {}  # step number -> digest, for steps assumed replicated
        self.operand_digests: dict[str, str] = {}  # "operand:N" -> digest of an assumed-replicated operand
        self.operand_names: dict[str, str] = {}  # "operand:N" -> where it was read
        self.operand_dims: dict[str, tuple] = {}  # "operand:N" -> the mesh dims it is assumed replicated over
        self._operands: dict[int, tuple[torch.Tensor, str]] = {}  # id -> (tensor, key)
        self._known: dict[int, tuple[torch.Tensor, Layout]] = {}  # id of a live tensor -> its layout
        self._shadow: dict[int, dict[str, Any]] = {}  # id(frame) -> values before the current instruction
        self._returns: dict[int, Any] = {}  # depth -> what the last block at that depth returned
        self._current: Optional[Layout] = None
        # (storage, offset, shape, stride) of a recorded plain tensor -> its layout: finds the tensor
        # again as the local part of a DTensor made from it (`from_local` takes a view of it)
        self._by_view: dict[tuple, Layout] = {}

    # -- lifecycle --------------------------------------------------------------------------

    def on_run_start(self, root: ModelBlockSchema, scope: dict) -> None:
        self._reset_logical()
        super().on_run_start(root, scope)

    def on_block_enter(self, event: Any) -> None:
        self._shadow[id(event.frame)] = {k: v for k, v in event.frame.items() if isinstance(v, torch.Tensor)}

    every_instruction = True  # tuple results too (not steps): their parts get layouts

    def on_instruction(self, event: Any) -> None:
        super().on_instruction(event)
        value = event.value
        if isinstance(value, (tuple, list)) and value and isinstance(event.instruction, OpInstruction):
            try:
                self._tuple_parts(event.instruction, event.frame, value)
            except Exception:  # a part left without a layout is read as replicated and checked, never a broken run
                pass

    def _tuple_parts(self, instr: OpInstruction, frame: dict, value: Any) -> None:
        """Layouts for the tensors of an op's tuple (or list) result, which is not a step itself."""
        for index, part in enumerate(value):
            if not isinstance(part, torch.Tensor) or self._lookup(part) is not None:
                continue
            dims: list[Optional[DimPlacement]] = [None] * len(self.names)
            sources: list[str] = []
            if is_dtensor(part):
                own = layout_of_dtensor(self.world, part)
                if own is not None:
                    dims = [d if d.kind != "unknown" else None for d in own.dims]
                    sources.append(own.source)
            reduced, assumes = self._from_op(instr, frame, part, dims, sources, part=index)
            if all(d is None for d in dims) and not sources:
                continue  # no operand: read as replicated where it is used, and checked
            final = tuple(d if d is not None else UNKNOWN for d in fill_single_rank(self.world, dims))
            layout = Layout(final, self.names, "; ".join(dict.fromkeys(sources)) + f" (part {index} of a tuple)",
                            reduced or any(d.kind == "partial" for d in final), assumes)
            self._known[id(part)] = (part, layout)
            if not is_dtensor(part):
                self._by_view[_view_key(part)] = layout

    def on_run_end(self, outputs: Any) -> None:
        super().on_run_end(outputs)
        self._shadow.clear()
        self._returns.clear()

    def _returned(self, instr: Any, frame: dict, depth: int) -> None:
        super()._returned(instr, frame, depth)
        value = frame.get(RETURN_SLOT) if RETURN_SLOT in frame else (
            frame.get(instr.out_vars[0]) if len(instr.out_vars) == 1 else None)
        self._returns[depth] = value

    def _took(self, instr: Instruction, frame: dict, value: torch.Tensor, depth: int, block: ModelBlockSchema,
              path: str, frames: Any) -> None:
        try:
            self._current = self._derive(instr, frame, value, depth, block)
        except Exception as exc:  # a rule that cannot run leaves the value unknown, never the run broken
            self._current = self._unknown(f"its placement could not be derived: {type(exc).__name__}: {exc}")
        try:
            super()._took(instr, frame, value, depth, block, path, frames)
        finally:
            self._current = None
        if instr.out_var:
            self._shadow.setdefault(id(frame), {})[instr.out_var] = value

    def _add(self, tensor: torch.Tensor, slot_type: str, description: str, out_var: str, op_name: str,
             block_path: str, depth: int) -> None:
        super()._add(tensor, slot_type, description, out_var, op_name, block_path, depth)
        number = self._count
        if slot_type == "input":
            layout = self._input_layout(tensor, out_var)
        elif slot_type == "output":
            layout = self._lookup(tensor)
        else:
            layout = self._current
        if layout is None:
            layout = Layout(tuple(REPLICATE for _ in self.names), self.names,
                            "assumed replicated, checked after the run", assumes=frozenset({number}))
            self.digests[number] = digest(tensor)
        self.layouts[number] = layout
        self._known[id(tensor)] = (tensor, layout)
        if not is_dtensor(tensor):
            self._by_view[_view_key(tensor)] = layout

    # -- the rules --------------------------------------------------------------------------

    def _unknown(self, why: str) -> Layout:
        return Layout(tuple(fill_single_rank(self.world, [UNKNOWN] * len(self.names))), self.names, why)

    def _input_layout(self, tensor: torch.Tensor, name: str) -> Optional[Layout]:
        base = name.split("[", 1)[0]
        given = self.input_placements.get(name, self.input_placements.get(base))
        if isinstance(given, Layout):
            return given
        if given is not None:
            placements = tuple(given) if isinstance(given, (tuple, list)) else (given,)
            if len(placements) != len(self.names):
                raise ValueError(f"input_placements[{base!r}] has {len(placements)} placements; the mesh has "
                                 f"{len(self.names)} dims {self.names}: give one torch placement per mesh dim")
            dims = tuple(dim_placement(p, tensor.ndim) for p in placements)
            return Layout(dims, self.names, "as input_placements says", any(d.kind == "partial" for d in dims))
        if is_dtensor(tensor):
            return layout_of_dtensor(self.world, tensor)
        if self.batch_dims and tensor.ndim:
            dims = tuple(DimPlacement("shard", 0) if i in self.batch_dims else REPLICATE for i in range(len(self.names)))
            assumes = frozenset({self._count}) if len(self.batch_dims) < len(self.names) else frozenset()
            if assumes:
                self.digests[self._count] = digest(tensor)
            return Layout(dims, self.names, "a data-parallel batch shard (FSDP2)", assumes=assumes)
        return None

    def _lookup(self, tensor: Any) -> Optional[Layout]:
        entry = self._known.get(id(tensor))
        if entry is not None and entry[0] is tensor:
            return entry[1]
        if not is_dtensor(tensor):
            return self._by_view.get(_view_key(tensor))
        layout = layout_of_dtensor(self.world, tensor)
        local = self._lookup(tensor._local_tensor)  # a DTensor made from a tensor of the run (from_local)
        if layout is not None and local is not None:
            dims = tuple(d if d.kind != "unknown" else o for d, o in zip(layout.dims, local.dims))
            layout = Layout(dims, self.names, layout.source, layout.reduced or local.reduced, local.assumes)
        return layout

    def _operand_layout(self, tensor: torch.Tensor, where: str) -> Layout:
        found = self._lookup(tensor)
        if found is not None and found.known:
            return found
        entry = self._operands.get(id(tensor))
        if entry is None or entry[0] is not tensor:
            key = f"operand:{len(self._operands) + 1}"
            self._operands[id(tensor)] = entry = (tensor, key)
            self.operand_digests[key] = digest(tensor)
            self.operand_names[key] = where
            self.operand_dims[key] = tuple(i for i in range(len(self.names))
                                           if found is None or found.dims[i].kind == "unknown")
        if found is not None:  # a DTensor on a submesh (a tensor-parallel weight): the other dims assumed
            dims = tuple(d if d.kind != "unknown" else REPLICATE for d in found.dims)
            return Layout(dims, self.names, found.source + "; replicated over the other mesh dims, checked after the run",
                          found.reduced, found.assumes | {entry[1]})
        return Layout(tuple(REPLICATE for _ in self.names), self.names,
                      "read as replicated (a weight or a tensor the schema did not produce), checked after the run",
                      assumes=frozenset({entry[1]}))

    def _derive(self, instr: Instruction, frame: dict, value: torch.Tensor, depth: int,
                block: ModelBlockSchema) -> Optional[Layout]:
        dims: list[Optional[DimPlacement]] = [None] * len(self.names)
        sources, reduced, assumes = [], False, frozenset()
        if is_dtensor(value):
            own = layout_of_dtensor(self.world, value)
            if own is not None:
                dims = [d if d.kind != "unknown" else None for d in own.dims]
                sources.append(own.source)
                reduced = own.partial
        if isinstance(instr, BlockInstruction):
            reduced_b, assumes_b = self._from_block(instr, frame, value, depth, block, dims, sources)
            reduced, assumes = reduced or reduced_b, assumes | assumes_b
        elif isinstance(instr, OpInstruction):  # reruns only for the dims still missing
            reduced_o, assumes_o = self._from_op(instr, frame, value, dims, sources)
            reduced, assumes = reduced or reduced_o, assumes | assumes_o
        if all(d is None for d in dims) and not sources:
            return None  # rule 4: assumed replicated, checked after the run
        final = tuple(d if d is not None else UNKNOWN for d in fill_single_rank(self.world, dims))
        return Layout(final, self.names, "; ".join(dict.fromkeys(sources)) or "unknown", reduced, assumes)

    def _from_block(self, instr: BlockInstruction, frame: dict, value: torch.Tensor, depth: int,
                    block: ModelBlockSchema, dims: list, sources: list) -> tuple[bool, frozenset]:
        reduced, assumes = False, frozenset()
        module = None
        if instr.block_ref.method is None:
            if instr.callee_var is not None:
                module = frame.get(instr.callee_var)
            else:
                try:
                    module = block.find(instr.block_ref.path).module
                except KeyError:
                    module = None
        if module is not None and not is_dtensor(value):
            styled = style_output_layout(self.world, module, value.ndim)
            if styled is not None:
                layout, _ = styled
                for i, d in enumerate(layout.dims):
                    if d.kind != "unknown" and dims[i] is None:
                        dims[i] = d
                sources.append(layout.source)
                # what the call was given went into it: a sum over shards upstream (a row-parallel
                # output before a norm) is in this output too, though the style's own is none; an
                # opaque call (transformers' `tp_forward`) has no inner steps that would say so
                given = self._call_inputs(instr, frame)
                reduced = layout.reduced or any(g.reduced for g in given)
                assumes = assumes.union(*(g.assumes for g in given))
        returned = self._returns.get(depth + 1)
        inner = self._lookup(returned) if isinstance(returned, torch.Tensor) else None
        if inner is None:
            return reduced, assumes
        same = returned is value
        if not same:
            try:
                here, there = local_of(value), local_of(returned)
                same = here.shape == there.shape and torch.equal(here, there)
            except (RuntimeError, TypeError):
                same = False
        styled = bool(sources)
        if same or styled:  # the values the callee returned, or what its style's hook made of them
            reduced, assumes = reduced or inner.reduced, assumes | inner.assumes
        if (same or styled) and any(d is None for d in dims):
            # a style's hook redistributes over its own mesh dims only: the others stay as returned
            for i, d in enumerate(inner.dims):
                if dims[i] is None and d.kind != "unknown":
                    dims[i] = d
            sources.append("what the block returned")
        return reduced, assumes

    def _call_inputs(self, instr: BlockInstruction, frame: dict) -> list[Layout]:
        """The known layouts of the tensors a block call passes (positional and keyword)."""
        found = []
        items = list(instr.args) + list(instr.kwargs.values())
        for operand in items:
            try:
                value = self._read(operand, frame, instr.out_var)
            except Exception:  # an operand this rule cannot read: it adds nothing
                continue
            for tensor in (value if isinstance(value, (tuple, list)) else (value,)):
                layout = self._lookup(tensor) if isinstance(tensor, torch.Tensor) else None
                if layout is not None:
                    found.append(layout)
        return found

    def _read(self, operand: Any, frame: dict, out_var: str) -> Any:
        if isinstance(operand, VarRef) and operand.name == out_var:
            shadow = self._shadow.get(id(frame), {})
            if out_var not in shadow:
                raise LookupError(f"{out_var!r} was rebound by this instruction and its earlier value is not known")
            return shadow[out_var]
        return operand_reader(operand)(frame)

    def _from_op(self, instr: OpInstruction, frame: dict, value: torch.Tensor, dims: list,
                 sources: list, part: Optional[int] = None) -> tuple[bool, frozenset]:
        out = instr.out_var
        args = [self._read(a, frame, out) for a in instr.args]
        spread = []
        for i, a in enumerate(args):
            spread.extend(a if i in instr.star_args else [a])
        if instr.args_var is not None:
            spread.extend(self._read(VarRef(instr.args_var), frame, out) or ())
        kwargs = {k: self._read(v, frame, out) for k, v in instr.kwargs.items()}
        if instr.kwargs_var is not None:
            kwargs.update(self._read(VarRef(instr.kwargs_var), frame, out) or {})
        target = self._read(instr.target, frame, out) if isinstance(instr.target, VarRef) else instr.target
        receiver = getattr(target, "__self__", None)
        receiver = receiver if isinstance(receiver, torch.Tensor) else None
        operands: list[tuple[torch.Tensor, Layout]] = []

        def collect(item: Any) -> None:
            if isinstance(item, torch.Tensor):
                operands.append((item, self._operand_layout(item, instr.display_name or instr.qualified_name)))
            elif isinstance(item, (list, tuple)):
                for child in item:
                    collect(child)
            elif isinstance(item, dict):
                for child in item.values():
                    collect(child)

        collect(receiver)
        collect(spread)
        collect(kwargs)
        if not operands:
            return False, frozenset()
        reduced = any(layout.reduced for _, layout in operands)
        assumes = frozenset().union(*(layout.assumes for _, layout in operands))
        missing = []
        for index in range(len(self.names)):
            if dims[index] is not None:
                continue
            kinds = [layout.dims[index] for _, layout in operands]
            if any(k.kind == "unknown" for k in kinds):
                dims[index] = UNKNOWN
                sources.append("an operand's placement is unknown")
            elif all(k.kind == "replicate" for k in kinds):
                dims[index] = REPLICATE
                sources.append("computed from replicated values")
            else:
                missing.append(index)
        if missing:
            found = self._rerun(target, receiver, spread, kwargs, operands, value, part)
            source = "DTensor's sharding rules for this op"
            if found is None:
                found, source = self._equal_operand(operands, value)
            if found is None and part is None and self.batch_dims:
                owner = getattr(target, "__self__", None)
                rows = batch_rows_dims(target, receiver, spread, kwargs, operands, value, missing, self.batch_dims,
                                       lambda: copy_callable(target, owner, receiver is None and _mutable_owner(owner)),
                                       layout_copy)
                if rows is not None:
                    found = [UNKNOWN] * len(self.names)
                    for index, d in zip(missing, rows):
                        found[index] = d if d is not None else UNKNOWN
                    source = "the op follows the batch's rows (checked on this rank's rows run again)"
            for index in missing:
                dims[index] = found[index] if found is not None else UNKNOWN
                reduced = reduced or dims[index].kind == "partial"
            sources.append(source if found is not None else "DTensor's rules gave another value or none")
        return reduced, assumes

    def _equal_operand(self, operands: list, value: torch.Tensor) -> tuple[Optional[tuple], str]:
        """When DTensor cannot run the op again (a KV cache's `update` concatenating onto its own empty
        tensors): the layout of an operand whose local part this rank's result equals. Sound because
        the ranks' layouts must agree (`consolidate`): equal on every rank, it is the same whole value."""
        local = local_of(value)
        for tensor, layout in operands:
            if not layout.known:
                continue
            theirs = local_of(tensor)
            if theirs.shape == local.shape and theirs.dtype == local.dtype and torch.equal(theirs, local):
                return layout.dims, "equal on this rank to an operand, whose placement it takes"
        return None, ""

    def _rerun(self, target: Any, receiver: Optional[torch.Tensor], args: list, kwargs: dict,
               operands: list, value: torch.Tensor, part: Optional[int] = None) -> Optional[tuple[DimPlacement, ...]]:
        """Rule 3: the op on DTensors of the world mesh made of the operands' local parts and layouts;
        its placements, when the result's local part (its part `part` of a tuple result) equals
        `value`'s (None otherwise)."""
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

        def torch_placement(d: DimPlacement) -> Any:
            return Shard(d.tensor_dim) if d.kind == "shard" else Partial(d.reduce_op) \
                if d.kind == "partial" else Replicate()

        def wrap_operands() -> dict[int, Any]:
            # copies of the local parts: an in-place op run again must not write the rank's tensors twice
            return {id(tensor): DTensor.from_local(layout_copy(local_of(tensor)), self.world,
                                                   [torch_placement(d) for d in layout.dims], run_check=False)
                    for tensor, layout in operands}

        def swap(item: Any, wrapped: dict) -> Any:
            if isinstance(item, torch.Tensor):
                return wrapped.get(id(item), item)
            if isinstance(item, tuple):
                return tuple(swap(c, wrapped) for c in item)
            if isinstance(item, list):
                return [swap(c, wrapped) for c in item]
            if isinstance(item, dict):
                return {k: swap(c, wrapped) for k, c in item.items()}
            return item

        call = target
        owner = getattr(target, "__self__", None)
        if receiver is None and _mutable_owner(owner):
            # a method of an object (a KV cache's `update`): run again on a copy, so the object the
            # run holds is not changed twice
            try:
                call = getattr(copy.deepcopy(owner), target.__name__)
            except Exception:
                return None
        local = local_of(value).detach()
        for call_args, call_kwargs in _size_variants(args, kwargs, operands, list(self.world.mesh.shape)):
            wrapped = wrap_operands()
            try:
                # the RNG as it was: a random op run again must not move the stream the run goes on with
                with torch.no_grad(), torch.random.fork_rng(devices=[]):
                    if receiver is not None:
                        result = getattr(swap(receiver, wrapped), target.__name__)(*swap(call_args, wrapped),
                                                                                   **swap(call_kwargs, wrapped))
                    else:
                        result = call(*swap(call_args, wrapped), **swap(call_kwargs, wrapped))
            except Exception:  # DTensor has no rule for it, or these sizes do not fit: try the next
                continue
            if part is not None:
                result = result[part] if isinstance(result, (tuple, list)) and len(result) > part else None
            if not is_dtensor(result):
                continue
            mine = result.to_local()
            if mine.shape == local.shape and mine.dtype == local.dtype and torch.equal(mine, local):
                return tuple(dim_placement(p, result.ndim) for p in result.placements)
        return None


def layout_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A detached copy of `tensor` with its sizes and strides (a view's gaps and repeats too).

    An op run again on a copy must see the layout the rank's op saw: CPU kernels split their loops
    by the layout, and a vectorised loop and its scalar tail round differently (on AVX-512,
    `torch.sigmoid` of a 16-wide `chunk` of a row runs the scalar tail and differs in the last bit
    from the same values made contiguous). `clone()` makes such a view contiguous; this copies the
    span of storage the view reads and views the copy the same way.
    """
    tensor = tensor.detach()
    if tensor.layout != torch.strided or tensor.numel() == 0 or tensor.is_contiguous():
        return tensor.clone()
    span = 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    flat = tensor.as_strided((span,), (1,), tensor.storage_offset()).clone()
    return flat.as_strided(tensor.shape, tensor.stride(), 0)


def _mutable_owner(owner: Any) -> bool:
    """Whether a bound callable's `__self__` is an object a call may change (not a module of
    functions, a class, a tensor or an nn.Module, whose state the run's own copies do not cover)."""
    if owner is None or isinstance(owner, (types.ModuleType, type, torch.Tensor, torch.nn.Module)):
        return False
    return not isinstance(owner, (int, float, str, bytes, tuple, frozenset, torch.dtype, torch.device))


def _size_variants(args: list, kwargs: dict, operands: list, sizes: list):
    """The op's arguments as given, then with the sizes of sharded dims written as global sizes.

    Code that runs per rank computes sizes from its local tensors (`x.view(batch, seq, -1, 8)` with
    `batch = x.shape[0]`, the rank's share of a data-parallel batch); DTensor reads them as global
    sizes. The second variant replaces every int argument equal to a sharded dim's local size with
    that size times the mesh dim's ranks. Whichever variant is kept, its result was checked equal
    to what the rank computed.
    """
    yield args, kwargs
    swaps = {}
    for tensor, layout in operands:
        local = local_of(tensor)
        factors: dict[int, int] = {}
        for d, ranks in zip(layout.dims, sizes):
            if d.kind == "shard" and d.tensor_dim < local.ndim:
                factors[d.tensor_dim] = factors.get(d.tensor_dim, 1) * ranks
        for dim, factor in factors.items():
            swaps[int(local.shape[dim])] = int(local.shape[dim]) * factor
    if not swaps:
        return

    changed = []

    def size(n: int) -> int:
        if n in swaps:
            changed.append(n)
            return swaps[n]
        return n

    def scale(item: Any) -> Any:
        if type(item) is int:
            return size(item)
        if isinstance(item, torch.Size):
            return torch.Size(size(n) for n in item)
        if isinstance(item, (tuple, list)) and item and all(type(n) is int for n in item):
            return type(item)(size(n) for n in item)
        return item

    scaled = [scale(a) for a in args]
    scaled_kwargs = {k: scale(v) for k, v in kwargs.items()}
    if changed:
        yield scaled, scaled_kwargs
