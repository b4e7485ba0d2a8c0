"""Producer/consumer analysis of one observed schema run: which op made each tensor, who read it.

`DataFlowRecorder` is a TraceListener. While the run is observed it also keeps a `CallLog` open
(`watching()`), which sees every aten call the run makes, whether an interpreted instruction made
it or a skipped child running eagerly. The calls made since the previous instruction event belong
to the instruction of the next event, so every instruction is matched with the tensors it really
read and returned; the operands it names (read from its frame) only fix the order of its inputs.

An instruction whose calls produce or mutate a tensor is an op; one that only moves existing
objects around (tuple unpacking, `getattr(self, "weight")`, a call into an interpreted sub-block)
is not. A call to a child that runs eagerly (skipped, or absent from the schema) is one op of kind
"module"; so is the whole forward when the root itself is skipped. Tensors are followed by
identity: the op that last returned or mutated a tensor object is its producer. Parameters and buffers of the model are "states"; the model's inputs are `input_<i>`,
its outputs `output_<i>`; any other tensor whose maker was not seen is `untracked_<i>`.

Op names are module-qualified and unique: `<module path>.<op type>` (no prefix in the root), with
`_1`, `_2`, ... for later ops of the same type in the same module.

`result()` builds the frozen records of `dataflow` from what the run saw.

Depends on schema, listeners, call_log and dataflow; never on the parser, interpreter or views.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook

from .call_log import UNKNOWN, Call, CallLog, Entered, instruction_operands, storage_key, tensor_leaves, written_tensors
from .dataflow import (DataFlow, InputEdge, ModelPort, ModuleCall, ModuleContext, ModuleInfo, ModuleNode, OpInfo,
                       build_module_infos, state_op)
from ..runtime.listeners import BlockEvent, InstructionEvent, TraceListener
from ..schema.model import BlockInstruction, ModelBlockSchema, OpInstruction, SourceLocation, TensorRepr, VarRef

__all__ = ["DataFlowRecorder"]


def _clean_type(name: str) -> str:
    cleaned = re.sub(r"[^0-9A-Za-z_]", "_", name).strip("_")
    return cleaned or "op"


def _describe(value: Any) -> TensorRepr:
    if isinstance(value, nn.parameter.UninitializedTensorMixin):  # a lazy module's weight before its first call
        return TensorRepr(shape=(), dtype=type(value).__name__)
    if isinstance(value, torch.Tensor):
        return TensorRepr(shape=tuple(int(d) for d in value.shape), dtype=str(value.dtype))
    return TensorRepr(shape=(), dtype=type(value).__name__)


def _qualified_type(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


# --- mutable state during a run ---------------------------------------------------------------


@dataclass
class _Source:
    kind: str  # "op" | "input" | "state" | "untracked"
    name: str
    op: Optional[int] = None
    slot: int = 0


@dataclass
class _Op:
    index: int
    name: str
    op_type: str
    kind: str
    stack: tuple[ModuleContext, ...]
    chain: tuple[int, ...]
    inputs: list[_Source]
    reprs: list[TensorRepr]
    consumers: list[list[str]]
    var_name: str
    location: Optional[SourceLocation]
    flops: int
    output_bytes: int
    entered: tuple[str, ...] = ()


@dataclass
class _ModuleCallState:
    index: int
    path: str
    module_type: str
    class_name: str
    depth: int
    parent: Optional[int]
    context: tuple[ModuleContext, ...]
    entry: dict[int, tuple[int, _Source]] = field(default_factory=dict)  # id(tensor) -> (position, source)
    var_name: str = ""
    output_reprs: tuple[TensorRepr, ...] = ()
    first_op: int = 0
    site: Optional[SourceLocation] = None  # the instruction of the caller that made this call


@dataclass
class _Site:
    """Where an op ran and what its instruction names: everything `_record_op` needs besides the log."""

    stack: tuple[ModuleContext, ...]
    chain: tuple[int, ...]
    call: Optional[_ModuleCallState]
    operands: list
    value: Any
    has_value: bool
    var_name: str
    location: Optional[SourceLocation]
    module: Optional[nn.Module]
    fallback_type: str


@dataclass
class _Level:
    block: ModelBlockSchema
    frame: dict
    call: _ModuleCallState
    owns_call: bool
    pending: list[Any] = field(default_factory=list)  # Call and Entered records
    pending_flops: int = 0


class DataFlowRecorder(TraceListener):
    """Follows tensors through one observed run of a schema; `result()` returns the DataFlow.

    Pass `listeners()` to the interpreter and run inside `watching()`, which keeps the call log open
    and notes eager module calls. `flop_meter`, when
    given, returns the running FLOP total (FlopMeter.read); its increase between two events is
    charged to the op of the later event.
    """

    def __init__(self, model: nn.Module, flop_meter: Optional[Callable[[], int]] = None) -> None:
        self._model = model
        self._meter = flop_meter
        self._log = CallLog()
        self._states: dict[int, _Source] = {}
        self._state_info: dict[str, tuple[str, TensorRepr]] = {}
        for kind, named in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
            for name, tensor in named:
                self._states.setdefault(id(tensor), _Source("state", name))
                self._state_info.setdefault(name, (kind, _describe(tensor)))
        self._module_types = {path: _qualified_type(m) for path, m in model.named_modules()}
        self._module_paths = {id(m): path for path, m in model.named_modules()}
        self._reset()

    def _reset(self) -> None:
        self._producers: dict[int, tuple[weakref.ref, _Source]] = {}
        self._ops: list[_Op] = []
        self._calls: list[_ModuleCallState] = []
        self._levels: list[_Level] = []
        self._names: dict[str, dict[str, int]] = {}
        self._inputs: list[ModelPort] = []
        self._outputs: list[tuple[str, torch.Tensor, _Source]] = []
        self._untracked = 0
        self._last_flops = 0
        self._stray_flops = 0
        self._last_exited: Optional[_ModuleCallState] = None
        self._root: Optional[ModelBlockSchema] = None
        self._scope_values: list = []
        self._result: Any = None
        self._module_boundaries: dict[str, tuple[dict[int, list[str]], dict[int, list[str]]]] = {}

    @contextlib.contextmanager
    def watching(self) -> Iterator["DataFlowRecorder"]:
        """Keep the call log open, and note every eager module call, for the duration of the run."""
        paths, log = self._module_paths, self._log

        def entered(module: nn.Module, args: Any) -> None:
            path = paths.get(id(module))
            if path is not None and not getattr(module.__dict__.get("forward"), "schema_lent", False):
                log.note(Entered(path))  # (a lent forward runs the module's schema: not an eager call)

        handle = register_module_forward_pre_hook(entered)
        try:
            with self._log:
                yield self
        finally:
            handle.remove()

    def listeners(self, others: Sequence[TraceListener] = ()) -> list[TraceListener]:
        """This recorder, then `others`, then a fence that forgets what they computed.

        Listeners run torch code of their own (a trace line takes `abs().sum()` of a value); the
        fence drops those calls and FLOPs, so they are not charged to the next instruction.
        """
        return [self, *others, _Fence(self)]

    def _forget(self) -> None:
        self._log.drain()
        if self._meter is not None:
            self._last_flops = self._meter()

    # -- bookkeeping --------------------------------------------------------------------------

    def _flops_since(self) -> int:
        if self._meter is None:
            return 0
        now = self._meter()
        delta, self._last_flops = now - self._last_flops, now
        return delta

    def _register(self, tensor: torch.Tensor, source: _Source) -> None:
        self._producers[id(tensor)] = (weakref.ref(tensor), source)

    def _source_of(self, tensor: torch.Tensor) -> _Source:
        entry = self._producers.get(id(tensor))
        if entry is not None and entry[0]() is tensor:
            return entry[1]
        state = self._states.get(id(tensor))
        if state is not None:
            return state
        source = _Source("untracked", f"untracked_{self._untracked}")
        self._untracked += 1
        self._register(tensor, source)
        return source

    def _boundary(self, path: str) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
        return self._module_boundaries.setdefault(path, ({}, {}))

    def _sync(self, frames: tuple) -> None:
        """Drop levels whose frame is gone (a block left by an exception the model caught)."""
        while len(self._levels) > 1 and not any(f is self._levels[-1].frame for f in frames):
            self._levels.pop()

    # -- listener hooks -----------------------------------------------------------------------

    def on_run_start(self, root: ModelBlockSchema, scope: dict) -> None:
        self._reset()
        self._root = root
        self._scope_values = list(scope.values())
        self._log.drain()
        self._last_flops = self._meter() if self._meter is not None else 0
        position = 0
        for name, value in scope.items():
            leaves = tensor_leaves(value)
            for k, tensor in enumerate(leaves):
                port = f"input_{position}"
                var = name if len(leaves) == 1 and isinstance(value, torch.Tensor) else f"{name}[{k}]"
                self._inputs.append(ModelPort(port, var, _describe(tensor)))
                self._register(tensor, _Source("input", port))
                position += 1

    def on_block_enter(self, event: BlockEvent) -> None:
        stray = self._log.drain()
        flops = self._flops_since()
        block = event.block
        parent = self._levels[-1] if self._levels else None
        if parent is not None:
            parent.pending.extend(stray)
            parent.pending_flops += flops
        else:
            self._stray_flops += flops
        if parent is not None and block.method_name is not None and parent.call.path == block.path:
            self._levels.append(_Level(block, event.frame, parent.call, owns_call=False))
            return
        context = (parent.call.context if parent is not None else ()) + (ModuleContext(block.path, block.module_type),)
        call = _ModuleCallState(index=len(self._calls), path=block.path, module_type=block.module_type,
                                class_name=block.name, depth=len(context) - 1,
                                parent=parent.call.index if parent is not None else None, context=context,
                                first_op=len(self._ops))
        sig = block.signature
        if sig is not None:
            names = list(sig.params) + ([sig.vararg] if sig.vararg else []) + list(sig.kwonly) + \
                ([sig.kwarg] if sig.kwarg else [])
            position = 0
            for name in names:
                if name in event.frame:
                    for tensor in tensor_leaves(event.frame[name]):
                        call.entry.setdefault(id(tensor), (position, self._source_of(tensor)))
                        position += 1
        self._calls.append(call)
        self._boundary(block.path)
        self._levels.append(_Level(block, event.frame, call, owns_call=True))

    def on_block_exit(self, event: BlockEvent) -> None:
        while len(self._levels) > 1 and self._levels[-1].frame is not event.frame:
            self._levels.pop()
        level = self._levels.pop()
        stray = self._log.drain()
        flops = self._flops_since()
        if self._levels:
            self._levels[-1].pending.extend(stray + level.pending)
            self._levels[-1].pending_flops += flops + level.pending_flops
        else:
            self._stray_flops += flops + level.pending_flops
        if not level.owns_call:
            return
        call = level.call
        leaves = tensor_leaves(event.result)
        call.output_reprs = tuple(_describe(t) for t in leaves)
        outputs = self._boundary(call.path)[1]
        for position, tensor in enumerate(leaves):
            source = self._source_of(tensor)
            label = f"{source.name}[{source.slot}]" if source.kind == "op" else source.name
            names = outputs.setdefault(position, [])
            if label not in names:
                names.append(label)
        self._last_exited = call

    def on_instruction(self, event: InstructionEvent) -> None:
        self._sync(event.frames)
        level = self._levels[-1]
        calls = level.pending + self._log.drain() if level.pending else self._log.drain()
        flops = level.pending_flops + self._flops_since()
        level.pending, level.pending_flops = [], 0
        instr = event.instruction
        if self._last_exited is not None and isinstance(instr, (BlockInstruction, OpInstruction)):
            if not self._last_exited.var_name:
                self._last_exited.var_name = instr.out_var
            if self._last_exited.site is None:
                self._last_exited.site = instr.location
            self._last_exited = None
        if not calls and not flops:
            return
        operands = instruction_operands(instr, event.frame) \
            if isinstance(instr, (OpInstruction, BlockInstruction)) else []
        site = _Site(stack=level.call.context, chain=tuple(self._chain(level.call)), call=level.call,
                     operands=operands, value=event.value, has_value=event.has_value, var_name=instr.out_var,
                     location=instr.location, module=self._eager_module(event),
                     fallback_type=self._instruction_name(instr))
        self._record_op(site, calls, flops)

    def on_run_end(self, outputs: Any) -> None:
        self._result = outputs
        log, flops = self._log.drain(), self._flops_since()
        if not self._calls and self._root is not None and self._root.module is not None:
            # The root itself was skipped: the whole forward ran eagerly, as one op of the root.
            root = self._root
            site = _Site(stack=(ModuleContext("", root.module_type),), chain=(), call=None,
                         operands=list(self._scope_values), value=outputs, has_value=True, var_name="",
                         location=None, module=root.module, fallback_type=root.name)
            self._record_op(site, log, flops)
        else:
            self._stray_flops += flops  # calls after the root returned (a decorator's epilogue) make no op
        for position, tensor in enumerate(tensor_leaves(outputs)):
            port = f"output_{position}"
            source = self._source_of(tensor)
            self._outputs.append((port, tensor, source))
            if source.kind == "op":
                self._ops[source.op].consumers[source.slot].append(port)

    # -- ops ----------------------------------------------------------------------------------

    def _record_op(self, site: _Site, log: list[Any], flops: int) -> None:
        calls = [c for c in log if isinstance(c, Call)]
        entered = tuple(dict.fromkeys(c.path for c in log if isinstance(c, Entered)))
        produced: dict[int, torch.Tensor] = {}
        read: dict[int, torch.Tensor] = {}
        written: list[torch.Tensor] = []
        for call in calls:
            for tensor in tensor_leaves((call.args, call.kwargs)):
                if id(tensor) not in produced:
                    read.setdefault(id(tensor), tensor)
            for tensor in tensor_leaves(call.result):
                produced[id(tensor)] = tensor
            written.extend(written_tensors(call))
        if not produced and not written and not flops:
            return
        inputs = self._ordered_inputs(site.operands, read)
        # A write into a view of an input (x[0] = y writes a select of x) changes that input.
        written_storages = {storage_key(t) for t in written} - {0}
        written_ids = {id(t) for t in written}
        # Writes into parameters and buffers (BatchNorm's running statistics in train mode) are side
        # effects on the model: those tensors stay states rather than becoming outputs.
        mutated = [t for t in {id(t): t for t in inputs}.values()
                   if (id(t) in written_ids or storage_key(t) in written_storages) and id(t) not in self._states]

        stack, kind, module = site.stack, "op", site.module
        if module is not None:
            kind, op_type = "module", type(module).__name__
            path = self._module_paths.get(id(module))
            if path is not None and path != stack[-1].module_name:
                stack = stack + (ModuleContext(path, _qualified_type(module)),)
        else:
            op_type = site.fallback_type
        op_type = _clean_type(op_type)
        name = self._unique_name(stack[-1].module_name, op_type)

        slots = tensor_leaves(site.value) if site.has_value else []
        slot_ids = {id(t) for t in slots}
        for tensor in mutated:
            produced[id(tensor)] = tensor
            if id(tensor) not in slot_ids:
                slots.append(tensor)
                slot_ids.add(id(tensor))
        index = len(self._ops)
        sources = [self._source_of(t) for t in inputs]
        op = _Op(index=index, name=name, op_type=op_type, kind=kind, stack=stack, chain=site.chain, inputs=sources,
                 reprs=[_describe(t) for t in slots], consumers=[[] for _ in slots], var_name=site.var_name,
                 location=site.location, flops=flops, output_bytes=0, entered=entered)
        self._ops.append(op)
        for position, (tensor, source) in enumerate(zip(inputs, sources)):
            if source.kind == "op":
                consumers = self._ops[source.op].consumers[source.slot]
                if name not in consumers:
                    consumers.append(name)
            if site.call is not None:
                self._link_module_inputs(site.call, tensor, source, f"{name}[{position}]")
        for slot, tensor in enumerate(slots):
            if id(tensor) in produced:
                self._register(tensor, _Source("op", name, index, slot))
                if not tensor._is_view():
                    op.output_bytes += tensor.nelement() * tensor.element_size()
        if kind == "module":
            # An eagerly run child shows no block events: its boundary is this op's own.
            ins, outs = self._boundary(stack[-1].module_name)
            for position, source in enumerate(sources):
                if source.kind != "state":
                    ins.setdefault(position, []).append(f"{name}[{position}]")
            for slot in range(len(slots)):
                outs.setdefault(slot, []).append(f"{name}[{slot}]")

    def _known(self, tensor: torch.Tensor) -> bool:
        entry = self._producers.get(id(tensor))
        return (entry is not None and entry[0]() is tensor) or id(tensor) in self._states

    def _ordered_inputs(self, named_values: list, read: dict[int, torch.Tensor]) -> list[torch.Tensor]:
        """The tensors an op read, one per argument position of the instruction where it names them.

        Operands come first, in argument order; the slot of a name the instruction rebinds
        (`x = x + y`) takes the first read tensor no operand accounts for. Tensors read only
        inside the call (a skipped child's weights) follow when they are known: states, model
        inputs and op outputs. Scalars torch wraps into tensors on the way in are left out.
        """
        operands = []
        for value in named_values:
            operands.extend([value] if value is UNKNOWN else tensor_leaves(value))
        named = {id(v) for v in operands if v is not UNKNOWN}
        spare = [t for key, t in read.items() if key not in named]
        ordered: list[torch.Tensor] = []
        for value in operands:
            if value is UNKNOWN:
                known = [t for t in spare if self._known(t)]
                if known or spare:
                    ordered.append(known[0] if known else spare[0])
                    spare.remove(ordered[-1])
            elif id(value) in read:
                ordered.append(value)
        ordered.extend(t for t in spare if self._known(t))
        return ordered

    def _link_module_inputs(self, call: _ModuleCallState, tensor: torch.Tensor, source: _Source, label: str) -> None:
        """Record `label` as reading input i of every active module call the tensor entered by."""
        current: Optional[_ModuleCallState] = call
        while current is not None:
            entry = current.entry.get(id(tensor))
            if entry is not None and entry[1] is source:
                names = self._boundary(current.path)[0].setdefault(entry[0], [])
                if label not in names:
                    names.append(label)
            current = self._calls[current.parent] if current.parent is not None else None

    def _chain(self, call: _ModuleCallState) -> list[int]:
        chain = [call.index]
        while call.parent is not None:
            call = self._calls[call.parent]
            chain.append(call.index)
        return chain[::-1]

    def _eager_module(self, event: InstructionEvent) -> Optional[nn.Module]:
        """The module an instruction ran eagerly as one piece (a skipped child), if it did."""
        instr = event.instruction
        if isinstance(instr, BlockInstruction):
            if instr.callee_var is not None:
                value = event.frame.get(instr.callee_var)
                return value if isinstance(value, nn.Module) else None
            try:
                block = event.block.find(instr.block_ref.path)
            except KeyError:
                return None
            return block.module if isinstance(block.module, nn.Module) else None
        if isinstance(instr, OpInstruction) and isinstance(instr.target, VarRef):
            value = event.frame.get(instr.target.name)
            return value if isinstance(value, nn.Module) else None
        return None

    @staticmethod
    def _instruction_name(instr: Any) -> str:
        """`linear` for F.linear, `add` for `a + b`, `view` for `x.view(...)` (a bound-method callee)."""
        if isinstance(instr, OpInstruction):
            if isinstance(instr.target, VarRef):
                name = instr.display_name or instr.target.name
            else:
                name = instr.qualified_name or instr.display_name
        elif isinstance(instr, BlockInstruction):
            name = instr.block_ref.method or "forward"
        else:
            name = type(instr).__name__
        return name.rsplit(".", 1)[-1]

    def _unique_name(self, path: str, op_type: str) -> str:
        counts = self._names.setdefault(path, {})
        seen = counts.get(op_type, 0)
        counts[op_type] = seen + 1
        base = op_type if seen == 0 else f"{op_type}_{seen}"
        return f"{path}.{base}" if path else base

    # -- result -------------------------------------------------------------------------------

    def result(self) -> DataFlow:
        """The frozen records of the last run."""
        ops: list[OpInfo] = []
        states = self._state_ops()
        sites = [c.site for c in self._calls]
        for raw in self._ops:
            edges = []
            for source in raw.inputs:
                producer = ops[source.op] if source.kind == "op" else states.get(source.name)
                edges.append(InputEdge(producer, source.slot, source.kind == "state", source.name))
            chain_sites = tuple(sites[i] for i in reversed(raw.chain[1:]) if sites[i] is not None)
            ops.append(OpInfo(index=raw.index, op_name=raw.name, op_type=raw.op_type, kind=raw.kind,
                              module_stack=raw.stack, inputs=tuple(edges),
                              outputs=tuple(tuple(c) for c in raw.consumers), output_reprs=tuple(raw.reprs),
                              var_name=raw.var_name, location=raw.location, flops=raw.flops,
                              output_bytes=raw.output_bytes, call_chain=raw.chain, eager_modules=raw.entered,
                              call_sites=((raw.location,) if raw.location else ()) + chain_sites))
        calls = tuple(ModuleCall(index=c.index, module_name=c.path, module_type=c.module_type,
                                 class_name=c.class_name, depth=c.depth, parent=c.parent, var_name=c.var_name,
                                 output_reprs=c.output_reprs, first_op=c.first_op, call_site=c.site)
                      for c in self._calls)
        outputs = []
        for port, tensor, source in self._outputs:
            producer = ops[source.op] if source.kind == "op" else states.get(source.name)
            edge = InputEdge(producer, source.slot, source.kind == "state", source.name)
            outputs.append(ModelPort(port, "", _describe(tensor), edge))
        attributed = sum(op.flops for op in ops)
        return DataFlow(ops=tuple(ops), calls=calls, modules=self._module_infos(ops, calls),
                        inputs=tuple(self._inputs), outputs=tuple(outputs),
                        total_flops=attributed + self._stray_flops, unattributed_flops=self._stray_flops,
                        result=self._result)

    def _state_ops(self) -> dict[str, OpInfo]:
        """One `is_state` record per parameter or buffer the run read, with the ops that read it."""
        consumers: dict[str, list[str]] = {}
        for raw in self._ops:
            for source in raw.inputs:
                if source.kind == "state" and raw.name not in consumers.setdefault(source.name, []):
                    consumers[source.name].append(raw.name)
        for _, _, source in self._outputs:
            if source.kind == "state":
                consumers.setdefault(source.name, [])
        return {name: state_op(name, *self._state_info[name], self._module_types, tuple(readers))
                for name, readers in consumers.items() if name in self._state_info}

    def _module_infos(self, ops: list[OpInfo], calls: tuple[ModuleCall, ...]) -> dict[str, ModuleInfo]:
        if self._root is None:
            return {}
        nodes: list[ModuleNode] = []

        def visit(block: ModelBlockSchema) -> None:
            nodes.append(ModuleNode(block.path, block.module_type, block.name,
                                    tuple(c.path for c in block.sub_blocks.values()), block.skip_reason))
            for child in block.sub_blocks.values():
                visit(child)

        visit(self._root)
        return build_module_infos(nodes, ops, calls, self._module_boundaries)


class _Fence(TraceListener):
    """Runs after every other listener and makes the recorder forget their torch calls and FLOPs."""

    def __init__(self, recorder: DataFlowRecorder) -> None:
        self._recorder = recorder

    def on_run_start(self, root: ModelBlockSchema, scope: dict) -> None:
        self._recorder._forget()

    def on_block_enter(self, event: BlockEvent) -> None:
        self._recorder._forget()

    def on_block_exit(self, event: BlockEvent) -> None:
        self._recorder._forget()

    def on_instruction(self, event: InstructionEvent) -> None:
        self._recorder._forget()
