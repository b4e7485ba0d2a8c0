"""Placements: where each captured value lives on a device mesh, one entry per mesh dimension.

A `Layout` says, for every dimension of the run's mesh (the "world" mesh `capture_logical` was given
or found), how the value a rank holds relates to the logical value: `shard` (this rank holds one
slice along `tensor_dim`), `replicate` (every rank of that mesh dimension holds all of it), `partial`
(every rank holds a term; the logical value is their sum) or `unknown` (nothing proves either; the
value cannot be gathered). `source` says how the layout was found, `reduced` whether a sum over
shards happened on the way (a partial sum, or anything computed from one), and `assumes` which
tentatively replicated steps it was derived from (checked after the run).

Also here: reading the layout of a DTensor, of a tensor-parallel style's hooks
(`parallelize_module` installs lambdas whose closures hold the style's `_prepare_output_fn` partial
and the mesh), of FSDP2's sharded parameters, and finding the world mesh of a model.

Depends on torch only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Optional, Sequence

import torch
from torch import nn

__all__ = ["DimPlacement", "Layout", "REPLICATE", "UNKNOWN", "layout_of_dtensor", "style_output_layout",
           "find_world_mesh", "fsdp_mesh_dims", "is_dtensor", "local_of"]


@dataclass(frozen=True)
class DimPlacement:
    """One mesh dimension's placement: kind is "shard", "replicate", "partial" or "unknown"."""

    kind: str
    tensor_dim: Optional[int] = None  # for "shard": which tensor dimension is split (never negative)
    reduce_op: str = "sum"  # for "partial"

    def badge(self) -> str:
        if self.kind == "shard":
            return f"S({self.tensor_dim})"
        if self.kind == "partial":
            return f"P({self.reduce_op})"
        return "R" if self.kind == "replicate" else "?"


REPLICATE = DimPlacement("replicate")
UNKNOWN = DimPlacement("unknown")


@dataclass(frozen=True)
class Layout:
    """A value's placement on every dimension of the world mesh, with how it was found."""

    dims: tuple[DimPlacement, ...]
    mesh_dim_names: tuple[str, ...]
    source: str = ""
    reduced: bool = False
    assumes: frozenset = field(default_factory=frozenset)

    @property
    def known(self) -> bool:
        return all(d.kind != "unknown" for d in self.dims)

    @property
    def partial(self) -> bool:
        return any(d.kind == "partial" for d in self.dims)

    def badge(self) -> str:
        """`S(1)@tp`, `R`, `S(0)@dp·P(sum)@tp`: what the widget shows next to a value."""
        if all(d.kind == "replicate" for d in self.dims):
            return "R"
        return "·".join(f"{d.badge()}@{name}" for d, name in zip(self.dims, self.mesh_dim_names))

    def describe(self) -> str:
        parts = []
        for d, name in zip(self.dims, self.mesh_dim_names):
            if d.kind == "shard":
                parts.append(f"sharded on tensor dim {d.tensor_dim} over mesh dim {name!r}")
            elif d.kind == "partial":
                parts.append(f"partial {d.reduce_op} over mesh dim {name!r}")
            elif d.kind == "replicate":
                parts.append(f"replicated over mesh dim {name!r}")
            else:
                parts.append(f"unknown over mesh dim {name!r}")
        return "; ".join(parts)

    def with_dim(self, index: int, placement: DimPlacement) -> "Layout":
        dims = list(self.dims)
        dims[index] = placement
        return replace(self, dims=tuple(dims))


def is_dtensor(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def local_of(value: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds: a DTensor's local shard, an async collective's result waited for."""
    if is_dtensor(value):
        value = value.to_local()
    wait = getattr(value, "wait", None)
    if wait is not None and type(value).__name__ == "AsyncCollectiveTensor":
        value = wait()
    return value


def dim_placement(placement: Any, ndim: int) -> DimPlacement:
    """A torch `Placement` (Shard, Replicate, Partial) as a DimPlacement; strided shards are unknown."""
    if placement.is_replicate():
        return REPLICATE
    if placement.is_partial():
        return DimPlacement("partial", reduce_op=str(getattr(placement, "reduce_op", "sum")))
    if placement.is_shard() and type(placement).__name__ == "Shard":
        dim = placement.dim
        return DimPlacement("shard", dim + ndim if dim < 0 else dim)
    return UNKNOWN  # _StridedShard and future kinds: this module does not gather them


def _dim_names(mesh: Any) -> tuple[str, ...]:
    names = mesh.mesh_dim_names
    return tuple(names) if names else tuple(f"dim{i}" for i in range(mesh.ndim))


def _world_index(world: Any, mesh: Any) -> Optional[list[int]]:
    """For each dim of `mesh`, its index in `world`; None when `mesh` is not `world` or a named submesh."""
    if mesh is world or (mesh.ndim == world.ndim and torch.equal(mesh.mesh, world.mesh)):
        return list(range(world.ndim))
    names, world_names = mesh.mesh_dim_names, world.mesh_dim_names
    if not names or not world_names or not set(names) <= set(world_names):
        return None
    return [list(world_names).index(n) for n in names]


def single_rank_dims(world: Any) -> tuple[int, ...]:
    """The world mesh dims of one rank: any value is whole on them (replicated), whatever computed it.

    transformers' `from_pretrained(tp_plan="auto")` builds a mesh `(pp=1, fsdp=1, tp=N)` (its root
    also has `dp_replicate=1`): a style's `tp` submesh leaves the others uncovered, yet they need no proof.
    """
    return tuple(i for i, n in enumerate(world.mesh.shape) if int(n) == 1)


def fill_single_rank(world: Any, dims: Sequence[Any]) -> list:
    """`dims` (DimPlacements, None or unknown where not found) with the one-rank mesh dims replicated."""
    single = set(single_rank_dims(world))
    return [REPLICATE if i in single and (d is None or d.kind == "unknown") else d for i, d in enumerate(dims)]


def layout_from(world: Any, mesh: Any, placements: Sequence[Any], ndim: int, source: str,
                reduced: bool = False) -> Optional[Layout]:
    """The world layout of `placements` on `mesh`; the world dims `mesh` does not cover are unknown
    (replicated when they have one rank)."""
    index = _world_index(world, mesh)
    if index is None:
        return None
    dims = fill_single_rank(world, [UNKNOWN] * world.ndim)
    for i, placement in zip(index, placements):
        dims[i] = dim_placement(placement, ndim)
    partial = any(d.kind == "partial" for d in dims)
    return Layout(tuple(dims), _dim_names(world), source, reduced or partial)


def layout_of_dtensor(world: Any, value: Any, source: str = "a DTensor's own placements") -> Optional[Layout]:
    return layout_from(world, value.device_mesh, value.placements, value.ndim, source)


def _closure_objects(hook: Any) -> Iterator[Any]:
    """What a hook refers to: itself, its bound `__self__`, a partial's func and args, closure cells."""
    seen = []
    stack = [hook]
    while stack:
        item = stack.pop()
        if any(item is s for s in seen) or len(seen) > 32:
            continue
        seen.append(item)
        yield item
        owner = getattr(item, "__self__", None)
        if owner is not None:
            stack.append(owner)
        func = getattr(item, "func", None)
        if func is not None and callable(func):
            stack.append(func)
            stack.extend(getattr(item, "args", ()))
        for cell in getattr(item, "__closure__", None) or ():
            try:
                stack.append(cell.cell_contents)
            except ValueError:  # an empty cell
                pass


# transformers' own tensor-parallel styles (transformers/distributed/tensor_parallel.py): what the
# output transform leaves, as (output placement, whether a sum over shards made it). A colwise
# output is this rank's slice of the last dim; a rowwise output is the all-reduced sum of the ranks'
# partial products. A vocab-parallel embedding's all-reduce is no reduction of the arithmetic: each
# token's row is looked up on the one rank holding it and every other rank adds exact zeros
# (x + 0.0 is x), so its output is the one-process lookup, as a hidden-dim embedding's gathered slices are.
def _transformers_style(style: Any) -> Optional[tuple[Any, bool]]:
    from torch.distributed.tensor.placement_types import Placement, Replicate

    names = {cls.__name__ for cls in type(style).__mro__}  # a subclass of a style is that style
    if not getattr(style, "use_local_output", False):
        return None  # a DTensor output carries its own placements
    if names & {"ColwiseParallel", "RowwiseParallel"}:
        layout = getattr(style, "output_layouts", None)
        if not isinstance(layout, Placement):
            return None
        return layout, "RowwiseParallel" in names
    if "EmbeddingParallel" in names:
        return Replicate(), False
    return None


def transformers_style_layout(world: Any, module: nn.Module, ndim: int) -> Optional[tuple[Layout, str]]:
    """The layout of what `module` returns when transformers' tensor parallelism (`tp_plan`) replaced
    its `forward` by `TensorParallelLayer.install_forward`'s `tp_forward` closure (it holds the style
    and the tp mesh), with the style's name; None for any other module or style."""
    from torch.distributed.device_mesh import DeviceMesh

    forward = module.__dict__.get("forward")
    if forward is None or getattr(forward, "__name__", "") != "tp_forward":
        return None
    mesh, style = None, None
    for item in _closure_objects(forward):
        if isinstance(item, DeviceMesh):
            mesh = item
        elif callable(getattr(item, "transform_output_post_forward", None)) and not isinstance(item, nn.Module):
            style = item
    if mesh is None or style is None:
        return None
    found = _transformers_style(style)
    if found is None:
        return None
    placement, reduced = found
    name = _style_name(type(style).__name__, reduced)
    layout = layout_from(world, mesh, (placement,), ndim, f"the output of transformers' {name} (tp_plan)", reduced)
    return (layout, name) if layout is not None else None


def _style_name(name: str, rowwise: bool) -> str:
    """A style's name in a layout's source; a subclass of RowwiseParallel says so, because the source
    is how a sum over shards at the style's output is told apart (`diverge_shards.StepRecorder.sums_in`)."""
    return f"{name} (a RowwiseParallel)" if rowwise and name != "RowwiseParallel" else name


def _rowwise_output_fn(func: Any) -> bool:
    """Whether `func` is the `_prepare_output_fn` of torch's RowwiseParallel or of a subclass of it
    (one that overrides it too: its input is still the partial sums of the row-sharded weight)."""
    from torch.distributed.tensor.parallel import RowwiseParallel

    stack = [RowwiseParallel]
    while stack:
        cls = stack.pop()
        own = cls.__dict__.get("_prepare_output_fn")
        if own is not None and getattr(own, "__func__", own) is func:
            return True
        stack.extend(cls.__subclasses__())
    return False


def style_output_layout(world: Any, module: nn.Module, ndim: int) -> Optional[tuple[Layout, str]]:
    """The layout of what `module` returns to its caller, read off a tensor-parallel style's output
    hook (ColwiseParallel, RowwiseParallel, PrepareModuleOutput...), or transformers' own style
    (`transformers_style_layout`), with the style's name.

    `parallelize_module` registers `lambda mod, inputs, outputs: output_fn(outputs, device_mesh)` where
    `output_fn` is `partial(Style._prepare_output_fn, output_layouts, use_local_output)`; the mesh is in
    the lambda's closure. Only a style that returns local tensors (`use_local_output=True`) leaves a
    plain tensor whose layout this gives; a DTensor output carries its own.
    """
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.placement_types import Placement

    found_hf = transformers_style_layout(world, module, ndim)
    if found_hf is not None:
        return found_hf
    for hook in list(module._forward_hooks.values()):
        mesh, found = None, None
        for item in _closure_objects(hook):
            if isinstance(item, DeviceMesh):
                mesh = item
            func = getattr(item, "func", None)
            if func is not None and getattr(func, "__name__", "") == "_prepare_output_fn":
                found = item
        if found is None or mesh is None or len(found.args) < 2:
            continue
        layouts, use_local = found.args[0], found.args[1]
        if isinstance(layouts, Placement):
            layouts = (layouts,)
        if not use_local or not isinstance(layouts, tuple) or not all(isinstance(p, Placement) for p in layouts):
            continue
        owner = found.func.__qualname__.split(".")  # `Style._prepare_output_fn`, `f.<locals>.Style._prepare_output_fn`
        rowwise = _rowwise_output_fn(found.func)
        style = _style_name(owner[-2] if len(owner) > 1 else owner[0], rowwise)
        layout = layout_from(world, mesh, layouts, ndim, f"the output of {style}", reduced=rowwise)
        if layout is not None:
            return layout, style
    return None


def fsdp_mesh_dims(world: Any, model: nn.Module) -> list[int]:
    """The world mesh dims FSDP2 shards `model`'s parameters over (its data-parallel dims)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover
        return []
    dims: set[int] = set()
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        state = module._get_fsdp_state()
        group = getattr(state, "_fsdp_param_group", None)
        mesh = getattr(getattr(group, "mesh_info", None), "mesh", None)
        if mesh is None:
            continue
        index = _world_index(world, mesh)
        if index is not None:
            dims.update(index)
    return sorted(dims)


def find_world_mesh(model: nn.Module) -> Any:
    """The one root DeviceMesh the model's DTensor parameters and parallel styles use, or None."""
    from torch.distributed.device_mesh import DeviceMesh

    meshes = []
    for tensor in list(model.parameters()) + list(model.buffers()):
        if is_dtensor(tensor):
            meshes.append(tensor.device_mesh)
    for module in model.modules():
        forward = module.__dict__.get("forward")  # transformers' tp_plan: a `tp_forward` closure holding the mesh
        hooks = [forward] if getattr(forward, "__name__", "") == "tp_forward" else []
        for hook in hooks + list(module._forward_hooks.values()) + list(module._forward_pre_hooks.values()):
            meshes.extend(item for item in _closure_objects(hook) if isinstance(item, DeviceMesh))
    roots = []
    for mesh in meshes:
        root = mesh._get_root_mesh() if hasattr(mesh, "_get_root_mesh") else mesh
        if not any(root is r for r in roots):
            roots.append(root)
    if len(roots) > 1:
        raise ValueError(f"the model uses {len(roots)} different device meshes; pass capture_logical(..., "
                         f"mesh=...) the one its values are placed on")
    return roots[0] if roots else None
