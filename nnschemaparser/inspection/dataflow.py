"""The records of an inspection run: ops, their input edges, module calls and module boundaries.

Plain frozen dataclasses built once, after the run, by `connectivity.DataFlowRecorder`. An op's
`InputEdge.producer` points at an earlier `OpInfo`, never a later one, so the records form a DAG in
execution order. `OpInfo`/`InputEdge` compare by identity and print short, since following
producers would otherwise walk the whole graph.

Depends on schema only (TensorRepr, SourceLocation); never on the recorder, parser or views.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..schema.model import SourceLocation, TensorRepr

__all__ = ["ModuleContext", "InputEdge", "OpInfo", "ModuleCall", "ModuleInfo", "ModelPort", "DataFlow"]


@dataclass(frozen=True)
class ModuleContext:
    """One module an op runs in: its registration path ("" for the root) and fully qualified type."""

    module_name: str
    module_type: str


@dataclass(frozen=True, eq=False, repr=False)
class InputEdge:
    """Where one tensor input of an op comes from.

    `producer` is the OpInfo that made it (None for model inputs, states and untracked tensors),
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
        """`relu.relu[0]` for an op's output, the plain name otherwise."""
        return f"{self.source}[{self.output_idx}]" if self.producer is not None else self.source


@dataclass(frozen=True, eq=False, repr=False)
class OpInfo:
    """One op of the run, in execution order.

    `inputs` has one InputEdge per tensor input position (states included, where they are passed);
    `outputs[n]` names the consumers of output slot n (op names, or `output_<i>` for model
    outputs). `kind` is "op" for a torch call of the schema and "module" for a child that ran
    eagerly as one piece. `call_chain` holds the indices of the ModuleCalls it ran inside (root
    first); `eager_modules` the paths of the modules it called eagerly, in order.
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
