"""Graph mode of the inspector: the ops of a model as `torch.export` sees them.

`export_flow(model, args, kwargs)` exports the model (`torch.export.export`, strict=False), walks
the FX graph of the exported program and builds the same `DataFlow` records the eager recorder
builds, so queries and the summary work unchanged:

- op names are the graph's global node names (`linear`, `linear_1`), op types the aten overload
  packet (`aten.linear.default` -> `linear`);
- the module stack of an op comes from its `nn_module_stack` (root first), its source lines from
  its `stack_trace` (the op's own line, then the lines that called it, innermost first);
- user inputs are the placeholders, named as the graph names them (`x`), and read as `x[0]`;
  parameters and buffers are states (their `is_state` records); lifted constants are
  `untracked_<i>`; the graph's output node is the consumer `output`;
- `operator.getitem` on a multi-output op is no op: it selects an output slot of its producer;
- a module's inputs are the tensors its ops read from outside it, numbered in order of first use
  (the model's own inputs in placeholder order for the root); its outputs are the tensors made
  inside and read outside, numbered in order of production (the output node's order for the root).

The exported graph is then run once on the example inputs (an `fx.Interpreter`, FLOPs counted per
node), under `preserved_state`, so `result` and per-op FLOPs are real, and its result is compared
exactly with the eager forward's from the same state: export may decompose a module differently
(the fused fast path of `nn.MultiheadAttention`), and the difference is returned, never hidden.
A model that export cannot handle raises `GraphExportError` naming the export failure and
suggesting eager mode.

Depends on the parser (`preserved_state`), schema records and dataflow; never on the views.
"""

from __future__ import annotations

import operator
import re
from typing import Any, Mapping, Optional, Sequence

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from .dataflow import (DataFlow, InputEdge, ModelPort, ModuleCall, ModuleContext, ModuleNode, OpInfo,
                       build_module_infos, state_op)
from ..parser.equality import Mismatch, first_mismatch
from ..parser.model_parser import preserved_state
from ..schema.errors import NNSchemaError
from ..schema.model import SourceLocation, TensorRepr

__all__ = ["GraphExportError", "export_flow"]

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in [^\n]*(?:\n(?P<code>[^\n]*))?')


class GraphExportError(NNSchemaError):
    """`torch.export` could not export the model for graph-mode inspection."""


def _qualified_type(obj: Any) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def _repr(value: Any) -> TensorRepr:
    if isinstance(value, torch.Tensor):
        return TensorRepr(shape=tuple(int(d) for d in value.shape), dtype=str(value.dtype))
    return TensorRepr(shape=(), dtype=type(value).__name__)


def _op_type(target: Any) -> str:
    packet = getattr(target, "_overloadpacket", None)
    name = getattr(packet, "__name__", None) or getattr(target, "__name__", None) or str(target)
    return re.sub(r"[^0-9A-Za-z_]", "_", name.rsplit(".", 1)[-1]).strip("_") or "op"


def _call_sites(node: torch.fx.Node) -> tuple[SourceLocation, ...]:
    trace = node.meta.get("stack_trace") or ""
    frames = [SourceLocation(m.group("file"), int(m.group("line")), (m.group("code") or "").strip())
              for m in _FRAME.finditer(trace)]
    return tuple(reversed(frames))


def _stack(node: torch.fx.Node, root: ModuleContext) -> tuple[tuple[ModuleContext, str], ...]:
    """(context, call key) pairs from the root to the innermost module the node ran in."""
    out = [(root, "")]
    for key, entry in (node.meta.get("nn_module_stack") or {}).items():
        path, module_type = entry[0], entry[1]
        if not path:
            continue
        if not isinstance(module_type, str):
            module_type = f"{module_type.__module__}.{module_type.__qualname__}"
        out.append((ModuleContext(path, module_type), key))
    return tuple(out)


def _tensor_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The node arguments that carry tensors, in argument order (lists flattened, kwargs after)."""
    found: list[torch.fx.Node] = []

    def walk(item: Any) -> None:
        if isinstance(item, torch.fx.Node):
            if isinstance(item.meta.get("val"), torch.Tensor) or item.op == "call_function" and \
                    isinstance(item.meta.get("val"), (tuple, list)):
                found.append(item)
        elif isinstance(item, (list, tuple)):
            for sub in item:
                walk(sub)
        elif isinstance(item, dict):
            for sub in item.values():
                walk(sub)

    walk(node.args)
    walk(node.kwargs)
    return found


def export_program(model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """`torch.export.export(model, args, kwargs)`, or GraphExportError saying why and what to do instead."""
    try:
        with preserved_state(model):
            return torch.export.export(model, tuple(args), dict(kwargs), strict=False)
    except Exception as exc:  # export fails in many ways; each becomes one clear error
        first = (str(exc).strip().splitlines() or [""])[0]
        raise GraphExportError(
            f"torch.export could not export {type(model).__name__} for execution_mode='graph' "
            f"({type(exc).__name__}: {first}); inspect it with execution_mode='eager', which runs the forward "
            "as written") from exc


class _Counter(torch.fx.Interpreter):
    """Runs the exported graph on real values, counting the FLOPs of each node."""

    def __init__(self, module: torch.fx.GraphModule) -> None:
        super().__init__(module)
        self.flops: dict[str, int] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op != "call_function":
            return super().run_node(n)
        counter = FlopCounterMode(display=False)
        with counter:
            value = super().run_node(n)
        self.flops[n.name] = int(counter.get_total_flops())
        return value


def _run(program: Any, model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Any, dict[str, int]]:
    """Run the exported graph once on the example inputs: its outputs and the FLOPs of each node."""
    signature = program.graph_signature
    state = program.state_dict
    flat_user = list(torch.utils._pytree.tree_leaves((tuple(args), dict(kwargs))))
    values: list[Any] = []
    user = iter(flat_user)
    for spec in signature.input_specs:
        kind = spec.kind.name
        if kind in ("PARAMETER", "BUFFER"):
            values.append(state[spec.target] if spec.target in state else program.constants[spec.target])
        elif kind in ("CONSTANT_TENSOR", "CUSTOM_OBJ"):
            values.append(program.constants[spec.target])
        else:
            values.append(next(user, None))
    counter = _Counter(program.graph_module)
    with preserved_state(model), torch.no_grad():
        outputs = counter.run(*values)
    user_outputs = [value for spec, value in zip(signature.output_specs, outputs) if spec.kind.name == "USER_OUTPUT"]
    result = program.call_spec.out_spec and torch.utils._pytree.tree_unflatten(user_outputs, program.call_spec.out_spec)
    return result, counter.flops


def _fresh(value: Any) -> Any:
    return torch.utils._pytree.tree_map(lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, value)


def export_flow(model: nn.Module, args: Sequence[Any] = (),
                kwargs: Optional[Mapping[str, Any]] = None) -> tuple[DataFlow, Any, Optional[Mismatch]]:
    """The DataFlow of `model` seen through `torch.export`, the ExportedProgram, and how its result
    differs from the eager forward's (None: bit for bit the same)."""
    kwargs = dict(kwargs or {})
    program = export_program(model, args, kwargs)
    result, flops = _run(program, model, _fresh(tuple(args)), _fresh(kwargs))
    with preserved_state(model), torch.no_grad():
        expected = model(*_fresh(tuple(args)), **_fresh(kwargs))
    mismatch = first_mismatch(expected, result)
    graph = program.graph_module.graph
    signature = program.graph_signature
    root = ModuleContext("", _qualified_type(model))
    module_types = {path: _qualified_type(m) for path, m in model.named_modules()}
    state_kinds: dict[str, tuple[str, str]] = {}  # placeholder name -> (state name, kind)
    constants: dict[str, int] = {}
    for spec in signature.input_specs:
        name = spec.arg.name
        if spec.kind.name in ("PARAMETER", "BUFFER"):
            state_kinds[name] = (spec.target, spec.kind.name.lower())
        elif spec.kind.name in ("CONSTANT_TENSOR", "CUSTOM_OBJ"):
            constants[name] = len(constants)

    nodes = list(graph.nodes)
    # The consumers of each (producer, slot), with getitem folded into its producer's slots.
    slot_of: dict[str, tuple[str, int]] = {}
    for node in nodes:
        if node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            base, _ = slot_of.get(node.args[0].name, (node.args[0].name, 0))
            slot_of[node.name] = (base, int(node.args[1]))
    def origin(node: torch.fx.Node) -> tuple[str, int]:
        return slot_of.get(node.name, (node.name, 0))

    op_nodes = [n for n in nodes if n.op == "call_function" and n.target is not operator.getitem]
    consumers: dict[tuple[str, int], list[str]] = {}
    readers: dict[str, list[str]] = {}
    for node in op_nodes:
        for arg in _tensor_args(node):
            key = origin(arg)
            names = consumers.setdefault(key, [])
            if node.name not in names:
                names.append(node.name)
    output_node = next(n for n in nodes if n.op == "output")
    output_args = [a for a in torch.utils._pytree.tree_leaves(output_node.args) if isinstance(a, torch.fx.Node)]
    user_outputs = [a for spec, a in zip(signature.output_specs, output_args) if spec.kind.name == "USER_OUTPUT"]
    for arg in user_outputs:
        consumers.setdefault(origin(arg), []).append("output")

    records: dict[str, OpInfo] = {}  # by node name: inputs, states and ops
    inputs: list[ModelPort] = []
    for node in nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if node.name in state_kinds:
            state, kind = state_kinds[node.name]
            readers[state] = [c for c in consumers.get((node.name, 0), []) if c != "output"]
            records[node.name] = state_op(state, kind, _repr(val), module_types, tuple(readers[state]))
        elif node.name not in constants:
            inputs.append(ModelPort(node.name, node.name, _repr(val)))
            records[node.name] = OpInfo(index=-1, op_name=node.name, op_type="input", kind="input",
                                        module_stack=(root,), inputs=(), outputs=(tuple(consumers.get((node.name, 0), ())),),
                                        output_reprs=(_repr(val),), var_name=node.name, location=None, flops=0,
                                        output_bytes=0, call_chain=())

    calls: list[ModuleCall] = []
    call_index: dict[str, int] = {"": 0}
    calls.append(ModuleCall(index=0, module_name="", module_type=root.module_type, class_name=type(model).__name__,
                            depth=0, parent=None, var_name="", output_reprs=(), first_op=0))
    boundaries: dict[str, tuple[dict[int, list[str]], dict[int, list[str]]]] = {}
    entries: dict[str, dict[tuple[str, int], int]] = {}  # module path -> external tensor -> input position
    ops: list[OpInfo] = []
    for node in op_nodes:
        stack = _stack(node, root)
        chain = []
        for depth, (context, key) in enumerate(stack):
            if key not in call_index:
                parent = chain[-1] if chain else 0
                call_index[key] = len(calls)
                calls.append(ModuleCall(index=len(calls), module_name=context.module_name,
                                        module_type=context.module_type,
                                        class_name=context.module_type.rsplit(".", 1)[-1], depth=depth,
                                        parent=parent, var_name="", output_reprs=(), first_op=len(ops)))
            chain.append(call_index[key])
        contexts = tuple(c for c, _ in stack)
        edges = []
        for position, arg in enumerate(_tensor_args(node)):
            base, slot = origin(arg)
            if base in constants:
                edges.append(InputEdge(None, 0, False, f"untracked_{constants[base]}"))
                continue
            producer = records.get(base)
            state = producer is not None and producer.is_state
            edges.append(InputEdge(producer, slot, state, producer.op_name if producer is not None else base))
            if state:
                continue
            for context in contexts:
                if producer.kind == "op" and _within(producer.module_stack, context.module_name):
                    continue  # made inside this module: not one of its inputs
                if context.module_name == "":
                    index = [p.name for p in inputs].index(base)
                else:
                    external = entries.setdefault(context.module_name, {})
                    index = external.setdefault((base, slot), len(external))
                names = boundaries.setdefault(context.module_name, ({}, {}))[0].setdefault(index, [])
                if f"{node.name}[{position}]" not in names:
                    names.append(f"{node.name}[{position}]")
        val = node.meta.get("val")
        reprs = tuple(_repr(v) for v in val) if isinstance(val, (tuple, list)) else (_repr(val),)
        sites = _call_sites(node)
        outputs = tuple(tuple(consumers.get((node.name, slot), ())) for slot in range(len(reprs)))
        record = OpInfo(index=len(ops), op_name=node.name, op_type=_op_type(node.target), kind="op",
                        module_stack=contexts, inputs=tuple(edges), outputs=outputs, output_reprs=reprs, var_name="",
                        location=sites[0] if sites else None, flops=flops.get(node.name, 0),
                        output_bytes=sum(t.numel() * t.element_size() for t in torch.utils._pytree.tree_leaves(val)
                                         if isinstance(t, torch.Tensor)),
                        call_chain=tuple(chain), call_sites=sites)
        records[node.name] = record
        ops.append(record)

    _module_outputs(ops, records, user_outputs, origin, boundaries)
    tree = _module_tree(model)
    outputs = []
    for position, arg in enumerate(user_outputs):
        base, slot = origin(arg)
        producer = records.get(base)
        edge = InputEdge(producer, slot, bool(producer is not None and producer.is_state),
                         producer.op_name if producer is not None else base)
        outputs.append(ModelPort(f"output_{position}", "", _repr(arg.meta.get("val")), edge))
    total = sum(flops.values())
    return DataFlow(ops=tuple(ops), calls=tuple(calls), modules=build_module_infos(tree, ops, calls, boundaries),
                    inputs=tuple(inputs), outputs=tuple(outputs), total_flops=total,
                    unattributed_flops=total - sum(op.flops for op in ops), result=result), program, mismatch


def _is_container(module: nn.Module) -> bool:
    """A ModuleList/ModuleDict-like holder without a forward: its entries belong to its parent, as in a schema."""
    return getattr(type(module).forward, "__name__", "") == "_forward_unimplemented"


def _module_tree(model: nn.Module) -> list[ModuleNode]:
    """Every module with a forward, root first; the entries of containers are children of the container's parent."""
    def children(module: nn.Module, path: str) -> list[str]:
        out = []
        for name, child in module.named_children():
            child_path = f"{path}.{name}" if path else name
            out.extend(children(child, child_path) if _is_container(child) else [child_path])
        return out

    return [ModuleNode(path, _qualified_type(m), type(m).__name__, tuple(children(m, path)))
            for path, m in model.named_modules() if path == "" or not _is_container(m)]


def _within(stack: tuple[ModuleContext, ...], path: str) -> bool:
    return any(c.module_name == path for c in stack)


def _module_outputs(ops: list[OpInfo], records: Mapping[str, OpInfo], user_outputs: list, origin: Any,
                    boundaries: dict) -> None:
    """Each module's outputs: tensors made inside it and read outside it (by an op or the output node)."""
    by_name = {op.op_name: op for op in ops}
    for op in ops:
        for slot, readers in enumerate(op.outputs):
            for path in (c.module_name for c in op.module_stack if c.module_name):
                leaves = any(r == "output" or r not in by_name or not _within(by_name[r].module_stack, path)
                             for r in readers)
                if not leaves:
                    continue
                outs = boundaries.setdefault(path, ({}, {}))[1]
                label = f"{op.op_name}[{slot}]"
                if label not in (name for names in outs.values() for name in names):
                    outs[len(outs)] = [label]
    root_outs = boundaries.setdefault("", ({}, {}))[1]
    for position, arg in enumerate(user_outputs):
        base, slot = origin(arg)
        producer = records.get(base)
        label = f"{base}[{slot}]" if producer is not None and not producer.is_state else (
            producer.op_name if producer is not None else base)
        root_outs[position] = [label]
