"""The records of an inspection run: ops, their input edges, module calls and module boundaries.

Plain frozen dataclasses built once, after the run, by `connectivity.DataFlowRecorder`. An op's
`InputEdge.producer` points at an earlier `OpInfo`, never a later one, so the records form a DAG in
execution order. `OpInfo`/`InputEdge` compare by identity and print short, since following
producers would otherwise walk the whole graph.

A parameter or buffer an op reads is an `OpInfo` too, with `is_state=True` and kind "state": the
producer of the op's state edges (`InputEdge.is_state`), not one of the run's ops. `filtered(types)`
keeps the ops of some types only (what a compressor can act on) while every edge still names its
real producer, so connectivity through a filtered op stays readable. `build_module_infos` turns a
module tree (from a schema or from `named_modules`) and the ops into `ModuleInfo`s.

Depends on schema only (TensorRepr, SourceLocation); never on the recorder, parser or views.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Collection, Mapping, Optional, Sequence

import torch

from ..schema.model import SourceLocation, TensorRepr

__all__ = ["ModuleContext", "InputEdge", "OpInfo", "ModuleCall", "ModuleInfo", "ModelPort", "DataFlow", "ModuleNode",
           "build_module_infos", "state_op"]

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


@dataclass(frozen=True)
class ModuleContext:
    """One module an op runs in: its registration path ("" for the root) and fully qualified type."""

    module_name: str
    module_type: str


@dataclass(frozen=True, eq=False, repr=False)
class InputEdge:
    """Where one tensor input of an op comes from.

    `producer` is the OpInfo that made it (for a state, its `is_state` record; None for model
    inputs and untracked tensors),
    `output_idx` that producer's output slot, `is_state` marks parameters and buffers, and `source`
    names the origin in every case: an op name, `input_<i>`, `untracked_<i>` or a state's path.
    """

    producer: Optional["OpInfo"]
    output_idx: int
    is_state: bool
    source: str

    def __repr__(self) -> str:
        return f"InputEdge({self.label()})"

    def label(self) -> str:
        """`relu.relu[0]` for an op's output, the plain name otherwise (inputs, states, untracked)."""
        return f"{self.source}[{self.output_idx}]" if self.producer is not None and not self.is_state else self.source


@dataclass(frozen=True, eq=False, repr=False)
class OpInfo:
    """One op of the run, in execution order.

    `inputs` has one InputEdge per tensor input position (states included, where they are passed);
    `outputs[n]` names the consumers of output slot n (op names, or `output_<i>` for model
    outputs). `kind` is "op" for a torch call of the schema and "module" for a child that ran
    eagerly as one piece. `call_chain` holds the indices of the ModuleCalls it ran inside (root
    first); `eager_modules` the paths of the modules it called eagerly, in order. `call_sites` are
    the source lines from the op outwards: its own line, then the line of each module call it ran
    inside, innermost first. `is_state` marks the record of a parameter or buffer (kind "state").
    """

    index: int
    op_name: str
    op_type: str
    kind: str
    module_stack: tuple[ModuleContext, ...]
    inputs: tuple[InputEdge, ...]
    outputs: tuple[tuple[str, ...], ...]
    output_reprs: tuple[TensorRepr, ...]
    var_name: str
    location: Optional[SourceLocation]
    flops: int
    output_bytes: int
    call_chain: tuple[int, ...]
    eager_modules: tuple[str, ...] = ()
    call_sites: tuple[SourceLocation, ...] = ()
    is_state: bool = False

    @property
    def call_site(self) -> Optional[SourceLocation]:
        """The innermost line of model code that made this op: the first of `call_sites` outside torch.

        For `self.linear1(x)` that is the line in the model's forward, not `F.linear` in torch's
        Linear; an op whose every line lies inside torch gives its own line.
        """
        for site in self.call_sites:
            if not os.path.abspath(site.filename).startswith(_TORCH_DIR):
                return site
        return self.call_sites[0] if self.call_sites else self.location

    @property
    def module_name(self) -> str:
        return self.module_stack[-1].module_name if self.module_stack else ""

    @property
    def module_type(self) -> str:
        return self.module_stack[-1].module_type if self.module_stack else ""

    @property
    def depth(self) -> int:
        """How many modules below the root this op runs (0: in the root's own forward)."""
        return len(self.module_stack) - 1

    @property
    def states(self) -> tuple[str, ...]:
        """Qualified names of the parameters and buffers this op reads, in argument order."""
        return tuple(dict.fromkeys(edge.source for edge in self.inputs if edge.is_state))

    def __repr__(self) -> str:
        ins = ", ".join(e.label() for e in self.inputs)
        return f"OpInfo({self.op_name!r} [{self.op_type}] in {self.module_name or '<root>'!r}; inputs: {ins})"


@dataclass(frozen=True)
class ModuleCall:
    """One call of a module during the run; `parent` is the index of the calling ModuleCall."""

    index: int
    module_name: str
    module_type: str
    class_name: str
    depth: int
    parent: Optional[int]
    var_name: str
    output_reprs: tuple[TensorRepr, ...]
    first_op: int
    call_site: Optional[SourceLocation] = None


@dataclass(frozen=True)
class ModuleInfo:
    """A module of the schema tree with its boundary as seen during the run.

    `inputs[i]` lists `op[n]` for each op inside that read input i of the module (n: the op's input
    position); `outputs[i]` names the producer of output i (`op[n]`, or an input/state name).
    Both merge every call of the module. `children` are sub-module paths, `ops` the names of the ops
    run directly in this module, both in first-execution order. `order` places the module among the
    ops: `2k` when it was first entered before op k ran, `2k + 1` when op k ran it eagerly (so op k
    itself sorts as `2k + 1` too); modules the run never entered sort last. `calls` counts block
    calls and eager calls; `run_by` names the ops of other modules that called this one eagerly
    (`apply_chunking_to_forward(self.feed_forward_chunk, ...)` runs its children that way).
    """

    module_name: str
    module_type: str
    class_name: str
    calls: int
    inputs: dict[int, tuple[str, ...]]
    outputs: dict[int, tuple[str, ...]]
    children: tuple[str, ...]
    ops: tuple[str, ...]
    skipped: Optional[str]
    order: int = 0
    run_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class ModelPort:
    """A model input or output tensor: its pseudo-op name (`input_0`, `output_0`), source name, repr."""

    name: str
    var_name: str
    repr: TensorRepr
    source: Optional[InputEdge] = None


@dataclass(frozen=True)
class DataFlow:
    """Everything the recorder learnt from one run."""

    ops: tuple[OpInfo, ...]
    calls: tuple[ModuleCall, ...]
    modules: dict[str, ModuleInfo]
    inputs: tuple[ModelPort, ...]
    outputs: tuple[ModelPort, ...]
    total_flops: int
    unattributed_flops: int
    result: Any = None

    def filtered(self, op_types: Optional[Collection[str]]) -> "DataFlow":
        """The same run showing only the ops whose type is in `op_types` (None: all of them).

        Edges keep naming their real producers, so `op inputs: {0: relu[0]}` still reads when the
        relu op itself is filtered out; module records keep their boundaries and list only the
        kept ops.
        """
        if op_types is None:
            return self
        kept = tuple(op for op in self.ops if op.op_type in op_types)
        names = {op.op_name for op in kept}
        modules = {path: dataclasses.replace(info, ops=tuple(n for n in info.ops if n in names))
                   for path, info in self.modules.items()}
        return dataclasses.replace(self, ops=kept, modules=modules)


def state_op(name: str, kind: str, repr: TensorRepr, module_types: Mapping[str, str],
             consumers: tuple[str, ...]) -> OpInfo:
    """The `is_state` record of parameter or buffer `name` ("linear2.weight"), read by `consumers`."""
    parts = name.split(".")[:-1]
    stack = tuple(ModuleContext(path, module_types.get(path, ""))
                  for path in [""] + [".".join(parts[:k]) for k in range(1, len(parts) + 1)])
    return OpInfo(index=-1, op_name=name, op_type=kind, kind="state", module_stack=stack, inputs=(),
                  outputs=(consumers,), output_reprs=(repr,), var_name="", location=None, flops=0, output_bytes=0,
                  call_chain=(), is_state=True)


@dataclass(frozen=True)
class ModuleNode:
    """One module of the tree an inspection describes: path, qualified type, class, children, skip reason."""

    path: str
    module_type: str
    class_name: str
    children: tuple[str, ...]
    skipped: Optional[str] = None


def build_module_infos(nodes: Sequence[ModuleNode], ops: Sequence[OpInfo], calls: Sequence[ModuleCall],
                       boundaries: Mapping[str, tuple[Mapping[int, list], Mapping[int, list]]]) -> dict[str, ModuleInfo]:
    """A ModuleInfo per node (root first), children in first-execution order, with calls and boundaries."""
    # A module's place among its siblings: the op count when the run first entered it (or first
    # ran it eagerly), so a child entered before op k is listed before op k.
    first_seen: dict[str, int] = {}
    for call in calls:
        first_seen.setdefault(call.module_name, 2 * call.first_op)
    for op in ops:
        for ctx in op.module_stack:
            first_seen[ctx.module_name] = min(first_seen.get(ctx.module_name, 2 * op.index + 1), 2 * op.index + 1)
    call_counts: dict[str, int] = {}
    for call in calls:
        call_counts[call.module_name] = call_counts.get(call.module_name, 0) + 1
    direct_ops: dict[str, list[str]] = {}
    run_by: dict[str, list[str]] = {}
    for op in ops:
        direct_ops.setdefault(op.module_name, []).append(op.op_name)
        for path in op.eager_modules:
            call_counts[path] = call_counts.get(path, 0) + 1
            first_seen[path] = min(first_seen.get(path, 2 * op.index + 1), 2 * op.index + 1)
            if path != op.module_name:
                run_by.setdefault(path, []).append(op.op_name)
    never = 2 * len(ops) + 2
    infos: dict[str, ModuleInfo] = {}
    for node in nodes:
        children = sorted(node.children, key=lambda c: first_seen.get(c, never))
        ins, outs = boundaries.get(node.path, ({}, {}))
        infos[node.path] = ModuleInfo(
            module_name=node.path, module_type=node.module_type, class_name=node.class_name,
            calls=call_counts.get(node.path, 0), order=first_seen.get(node.path, never),
            inputs={k: tuple(v) for k, v in sorted(ins.items())}, outputs={k: tuple(v) for k, v in sorted(outs.items())},
            children=tuple(children), ops=tuple(direct_ops.get(node.path, ())), skipped=node.skipped,
            run_by=tuple(run_by.get(node.path, ())))
    return infos
