"""The `.neurarch.json` graph of an inspection run: one node per layer call, in the Neurarch vocabulary.

    {"format": "neurarch/1", "name": "ResNet18", "target": ..., "batchSize": 1, "depth": null,
     "runs": true, "blockers": [], "inputs": [...], "nodes": [...], "edges": [...], "totals": {...},
     "unusedParams": [...], "opaque": {...}}

Nodes, in execution order:

- one `input` node per model input (`params`: its shape and dtype);
- one node per call of a *layer*: a module the mapping table (`neurarch_types`) knows, a module
  that calls no child module (a leaf), or, with `depth=N`, a module N levels below the root. Its
  `type` is the table's (`linear`, `conv2d`, `layerNorm`, `multiHeadAttention`, ...) or
  `customModule` (params `className`, `paramCount`); `id` is the module path (`@1`, `@2` for later
  calls of the same module); children of a layer are not descended;
- an `add` node for each addition of two tensors outside every layer (a residual add) and a
  `concatenate` node for each `cat`/`stack`; every other functional op (reshapes, softmax, RoPE
  math) gets no node: the layers around it are wired directly;
- one `output` node.

`scope` on every node is the dotted path of the module whose forward made the call (the layer's
parent module; `""` at the root). Shapes (`inputShape`, `outputShape`) are written without the
batch dimension: the first dim of every input is the batch. Edges follow the run's real data flow
(the inspector's producer records), traced back through functional ops to the nodes that made
their inputs. A layer that runs no op (Dropout and Identity in eval mode return their input) is
spliced in where its module's boundary says its output came from, when it is called once.

`totals` carries parameters (each tensor once), FLOPs (torch's FlopCounterMode over the run),
`activationBytes` (bytes of every op output of the run, views not counted: what training keeps for
backward at `batchSize`), `largestActivationBytes` (the biggest single op output) and
`parameterBytes`. `unusedParams` names parameters no op read.

Depends on inspector, dataflow, flops and neurarch_types; never on the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

from torch import nn
from torch.nn.parameter import is_lazy

from ..schema.errors import NNSchemaError
from .dataflow import InputEdge, OpInfo
from .flops import count_parameters
from .inspector import ModelInspector
from .neurarch_types import is_mapped, neurarch_params, neurarch_type

__all__ = ["NEURARCH_FORMAT", "GraphFileError", "build_neurarch_graph", "failure_graph", "outgoing_graph",
           "read_graph", "validate_graph", "default_graph_path", "MAX_GRAPH_NODES", "MAX_GRAPH_FILE_BYTES"]

NEURARCH_FORMAT = "neurarch/1"
ADD_OPS = frozenset({"add", "add_", "iadd", "__add__", "__iadd__", "__radd__"})
CONCAT_OPS = frozenset({"cat", "concat", "concatenate", "stack", "hstack", "vstack", "dstack"})
#: The largest graph file `read_graph` reads (`--base`); past it the file is refused unread.
MAX_GRAPH_FILE_BYTES = 256 * 1024 * 1024
MAX_GRAPH_NODES = 200_000


class GraphFileError(NNSchemaError):
    """A graph file that is not a readable `.neurarch.json` graph; the message names what is wrong."""


def default_graph_path(name: str, suffix: str = ".neurarch.json") -> Path:
    """`<Name>.neurarch.json` in the current directory (characters unsafe in a file name become `_`)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).strip(".") or "model"
    return Path(f"{safe}{suffix}")


def _strip(shape: Sequence[int]) -> list[int]:
    return [int(d) for d in shape[1:]]


def _dtype(text: str) -> str:
    return text.replace("torch.", "")


def _scope(path: str) -> str:
    return path.rpartition(".")[0]


def _param_bytes(model: nn.Module) -> int:
    return sum(0 if is_lazy(p) else int(p.numel()) * p.element_size() for p in model.parameters())


class _Builder:
    def __init__(self, inspector: ModelInspector, depth: Optional[int]) -> None:
        self.inspector = inspector
        self.flow = inspector.flow
        self.model = inspector.model
        self.modules = dict(self.model.named_modules())
        self.depth = depth
        self.nodes: list[dict[str, Any]] = []
        self.edges: list[dict[str, str]] = []
        self.edge_keys: set[tuple[str, str]] = set()
        self.ids: set[str] = set()

    def unique(self, base: str) -> str:
        node_id, n = base, 1
        while node_id in self.ids:
            node_id, n = f"{base}@{n}", n + 1
        self.ids.add(node_id)
        return node_id

    def edge(self, source: str, target: str) -> None:
        if source != target and (source, target) not in self.edge_keys:
            self.edge_keys.add((source, target))
            self.edges.append({"source": source, "target": target})

    def layer_calls(self) -> dict[int, int]:
        """Call index -> index of the layer call that holds it (itself, or an enclosing layer)."""
        has_children = {c.parent for c in self.flow.calls if c.parent is not None}
        has_children |= {op.call_chain[-1] for op in self.flow.ops if op.kind == "module" and op.call_chain}
        owner: dict[int, int] = {}
        for call in self.flow.calls:  # a parent's call always comes before its children's
            if call.parent is not None and call.parent in owner:
                owner[call.index] = owner[call.parent]
                continue
            module = self.modules.get(call.module_name)
            if (self.depth is not None and call.depth >= self.depth) or (module is not None and is_mapped(module)) \
                    or call.index not in has_children:
                owner[call.index] = call.index
        return owner

    def module_node(self, path: str, output_reprs: Sequence[Any], flops: int) -> dict[str, Any]:
        module = self.modules.get(path, self.model)
        node = {"id": self.unique(path or "root"), "type": neurarch_type(module),
                "name": type(module).__name__, "scope": _scope(path) if path else "", "module": path,
                "params": neurarch_params(module), "inputShape": None,
                "outputShape": _strip(output_reprs[0].shape) if output_reprs else None,
                "paramCount": count_parameters(module), "flops": flops}
        self.nodes.append(node)
        return node

    def build(self) -> None:
        flow = self.flow
        self.port_ids: dict[str, str] = {}
        for position, port in enumerate(flow.inputs):
            node_id = self.unique(port.var_name or f"input_{position}")
            self.port_ids[port.name] = node_id
            self.nodes.append({"id": node_id, "type": "input", "name": port.var_name, "scope": "", "module": None,
                               "params": {"shape": _strip(port.repr.shape), "dtype": _dtype(port.repr.dtype)},
                               "inputShape": None, "outputShape": _strip(port.repr.shape), "paramCount": 0,
                               "flops": 0})
        self.port_reprs = {port.name: port.repr for port in flow.inputs}
        owner_call = self.layer_calls()
        ops_of_call: dict[int, list[OpInfo]] = {}
        for op in flow.ops:
            if op.call_chain and op.call_chain[-1] in owner_call:
                ops_of_call.setdefault(owner_call[op.call_chain[-1]], []).append(op)
        self.node_of_op: dict[str, dict[str, Any]] = {}
        # layer nodes of calls that run no op are spliced onto the tensor they pass through
        self.splices: dict[tuple[str, int], list[tuple[int, dict[str, Any]]]] = {}
        self.splice_sources: dict[str, tuple[str, int]] = {}
        emitted: set[int] = set()
        pending_empty = [c for c in flow.calls if owner_call.get(c.index) == c.index and c.index not in ops_of_call]
        order: list[tuple[int, int, Any]] = [(c.first_op, 0, c) for c in pending_empty]
        order += [(op.index, 1, op) for op in flow.ops]
        for _, kind, item in sorted(order, key=lambda t: (t[0], t[1])):
            if kind == 0:
                self.empty_layer(item)
                continue
            op = item
            call = owner_call.get(op.call_chain[-1]) if op.call_chain else None
            if call is not None:
                if call not in emitted:
                    emitted.add(call)
                    record = flow.calls[call]
                    node = self.module_node(record.module_name, record.output_reprs,
                                            sum(o.flops for o in ops_of_call[call]))
                    for member in ops_of_call[call]:
                        self.node_of_op[member.op_name] = node
                continue
            if op.kind == "module":
                self.node_of_op[op.op_name] = self.module_node(op.module_name, op.output_reprs, op.flops)
            elif op.op_type in ADD_OPS and len(self.data_inputs(op)) >= 2:
                self.node_of_op[op.op_name] = self.functional_node(op, "add")
            elif op.op_type in CONCAT_OPS:
                self.node_of_op[op.op_name] = self.functional_node(op, "concatenate")
        self.transparent: dict[str, set[str]] = {}
        for node in self.nodes:
            if node["type"] != "input":
                self.wire(node)
        out_id = self.unique("output")
        first = flow.outputs[0].repr if flow.outputs else None
        self.nodes.append({"id": out_id, "type": "output", "name": "output", "scope": "", "module": None, "params": {},
                           "inputShape": _strip(first.shape) if first is not None else None, "outputShape": None,
                           "paramCount": 0, "flops": 0})
        for port in flow.outputs:
            if port.source is not None:
                for source in self.resolve(port.source, len(flow.ops)):
                    self.edge(source, out_id)

    def data_inputs(self, op: OpInfo) -> list[InputEdge]:
        return [e for e in op.inputs if not e.is_state and (e.producer is not None or e.source.startswith("input_"))]

    def functional_node(self, op: OpInfo, kind: str) -> dict[str, Any]:
        params = {"inputs": len(self.data_inputs(op))}
        if kind == "concatenate":
            params["mode"] = "stack" if op.op_type == "stack" else "cat"
        node = {"id": self.unique(op.op_name), "type": kind, "name": op.op_type, "scope": op.module_name,
                "module": None, "params": params, "inputShape": None,
                "outputShape": _strip(op.output_reprs[0].shape) if op.output_reprs else None, "paramCount": 0,
                "flops": op.flops}
        self.nodes.append(node)
        return node

    def empty_layer(self, call: Any) -> None:
        node = self.module_node(call.module_name, call.output_reprs, 0)
        info = self.flow.modules.get(call.module_name)
        produced = info.outputs.get(0, ()) if info is not None and info.calls == 1 else ()
        if len(produced) != 1:
            return  # called more than once or with no traceable output: the node stays unwired
        label = produced[0]
        name, sep, slot = label.rpartition("[")
        key = (name, int(slot.rstrip("]"))) if sep and slot.rstrip("]").isdigit() else (label, 0)
        self.splices.setdefault(key, []).append((call.first_op, node))
        self.splice_sources[node["id"]] = key
        node["_first_op"] = call.first_op

    def _op(self, name: str) -> Optional[OpInfo]:
        if not hasattr(self, "_ops_by_name"):
            self._ops_by_name = {op.op_name: op for op in self.flow.ops}
        return self._ops_by_name.get(name)

    def resolve_key(self, key: tuple[str, int], at: int, producer: Optional[OpInfo]) -> set[str]:
        """The nodes a tensor read at op index `at` comes from: a splice, its producer's node, or further back."""
        for first_op, node in reversed(self.splices.get(key, [])):
            if first_op <= at:
                return {node["id"]}
        name = key[0]
        if producer is None:
            return {self.port_ids[name]} if name in self.port_ids else set()
        node = self.node_of_op.get(producer.op_name)
        if node is not None:
            return {node["id"]}
        if producer.op_name not in self.transparent:
            found: set[str] = set()
            for edge in self.data_inputs(producer):
                found |= self.resolve(edge, producer.index)
            self.transparent[producer.op_name] = found
        return self.transparent[producer.op_name]

    def resolve(self, edge: InputEdge, at: int) -> set[str]:
        key = (edge.producer.op_name, edge.output_idx) if edge.producer is not None else (edge.source, 0)
        return self.resolve_key(key, at, edge.producer)

    def wire(self, node: dict[str, Any]) -> None:
        if node["id"] in self.splice_sources:
            key = self.splice_sources[node["id"]]
            at = node.pop("_first_op") - 1
            producer = self._op(key[0])
            for source in sorted(self.resolve_key(key, at, producer)):
                self.edge(source, node["id"])
            repr_ = producer.output_reprs[key[1]] if producer is not None else self.port_reprs.get(key[0])
            node["inputShape"] = _strip(repr_.shape) if repr_ is not None else None
            return
        node.pop("_first_op", None)
        members = [op for op in self.flow.ops if self.node_of_op.get(op.op_name) is node]
        shapes: list[list[int]] = []
        for op in members:
            for edge in self.data_inputs(op):
                if edge.producer is not None and self.node_of_op.get(edge.producer.op_name) is node:
                    continue
                for source in sorted(self.resolve(edge, op.index)):
                    self.edge(source, node["id"])
                repr_ = (edge.producer.output_reprs[edge.output_idx] if edge.producer is not None
                         else self.port_reprs.get(edge.source))
                if repr_ is not None:
                    shapes.append(_strip(repr_.shape))
        if shapes:
            node["inputShape"] = shapes[0]
            if node["type"] in ("add", "concatenate"):
                node["inputShapes"] = shapes


def build_neurarch_graph(inspector: ModelInspector, *, name: Optional[str] = None, target: Optional[str] = None,
                         depth: Optional[int] = None, inputs: Optional[list[str]] = None) -> dict[str, Any]:
    """The `.neurarch.json` graph of `inspector`'s run (see the module docstring); `depth` stops descending."""
    if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 0):
        raise ValueError(f"depth must be a whole number >= 0 (0 keeps only the root), got {depth!r}")
    builder = _Builder(inspector, depth)
    builder.build()
    flow, model = inspector.flow, inspector.model
    read = {state for op in flow.ops for state in op.states}
    # a child run eagerly as one piece reads its parameters out of sight: count them as read
    eager = tuple(op.module_name + "." if op.module_name else "" for op in flow.ops if op.kind == "module")
    unused = [n for n, _ in model.named_parameters() if n not in read and not n.startswith(eager)]
    batch = flow.inputs[0].repr.shape[0] if flow.inputs and flow.inputs[0].repr.shape else 1
    layers = [n for n in builder.nodes if n["module"] is not None]
    return {
        "format": NEURARCH_FORMAT,
        "name": name or inspector.schema.name,
        "target": target,
        "modelType": inspector.schema.module_type,
        "batchSize": int(batch),
        "depth": depth,
        "runs": True,
        "blockers": [],
        "inputs": inputs if inputs is not None else [p.repr.describe() for p in flow.inputs],
        "nodes": builder.nodes,
        "edges": builder.edges,
        "totals": {"params": count_parameters(model), "trainableParams": count_parameters(model, trainable_only=True),
                   "parameterBytes": _param_bytes(model), "flops": int(inspector.total_flops),
                   "activationBytes": int(sum(op.output_bytes for op in flow.ops)),
                   "largestActivationBytes": int(max((op.output_bytes for op in flow.ops), default=0)),
                   "layers": len(layers),
                   "nodes": len(builder.nodes), "edges": len(builder.edges)},
        "unusedParams": unused,
        "opaque": {path: reason.splitlines()[0] if reason else "" for path, reason in inspector.schema.skipped.items()},
    }


def failure_graph(model: nn.Module, error: BaseException, *, name: str, target: Optional[str],
                  inputs: list[str]) -> dict[str, Any]:
    """The graph of a model whose forward does not run: its inputs, its size and the blocker, no layers."""
    message = str(error).strip().splitlines()
    return {
        "format": NEURARCH_FORMAT, "name": name, "target": target, "modelType": type(model).__qualname__,
        "batchSize": None, "depth": None, "runs": False,
        "blockers": [f"the forward does not run: {type(error).__name__}: {message[0] if message else ''}"],
        "inputs": inputs, "nodes": [], "edges": [],
        "totals": {"params": count_parameters(model), "trainableParams": count_parameters(model, trainable_only=True),
                   "parameterBytes": _param_bytes(model), "flops": None, "activationBytes": None, "largestActivationBytes": None, "layers": 0,
                   "nodes": 0, "edges": 0},
        "unusedParams": [], "opaque": {},
    }


_FAILED = "the forward does not run: "


def outgoing_graph(graph: dict[str, Any]) -> dict[str, Any]:
    """The graph as `--plan` and `--share` send it: layer types, shapes and hyperparameters, with the
    two texts that may quote the model's code or paths left out: the reasons of `opaque` modules
    (their paths stay, as empty strings) and the message of a failed forward (its exception type stays).
    The graph on disk keeps both."""
    sent = dict(graph)
    if isinstance(graph.get("opaque"), dict):
        sent["opaque"] = {str(path): "" for path in graph["opaque"]}
    if isinstance(graph.get("blockers"), list):
        sent["blockers"] = [_FAILED + b[len(_FAILED):].split(":", 1)[0]
                            if isinstance(b, str) and b.startswith(_FAILED) else b for b in graph["blockers"]]
    return sent


def _is_count(value: Any) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)


def _is_shape(value: Any) -> bool:
    return value is None or (isinstance(value, list) and all(
        isinstance(d, int) and not isinstance(d, bool) for d in value))


def validate_graph(graph: Any, where: str = "the graph") -> dict[str, Any]:
    """Check that `graph` is a neurarch graph this package can read; return it, or raise GraphFileError."""
    if not isinstance(graph, dict):
        raise GraphFileError(f"{where} is a JSON {type(graph).__name__}, not an object with format/nodes/edges")
    if graph.get("format") != NEURARCH_FORMAT:
        found = graph.get("format")
        hint = " (an nnsp graph: write it with --format neurarch)" if str(found).startswith("nnschemaparser") else ""
        raise GraphFileError(f"{where} has format {found!r}, expected {NEURARCH_FORMAT!r}{hint}")
    nodes, edges, totals = graph.get("nodes"), graph.get("edges"), graph.get("totals")
    if not isinstance(nodes, list) or not isinstance(edges, list) or not isinstance(totals, dict):
        raise GraphFileError(f"{where} needs lists 'nodes' and 'edges' and an object 'totals'")
    if len(nodes) > MAX_GRAPH_NODES:
        raise GraphFileError(f"{where} has {len(nodes)} nodes, more than the limit of {MAX_GRAPH_NODES}")
    ids = set()
    for index, node in enumerate(nodes):
        if not isinstance(node, dict) or not isinstance(node.get("id"), str) or not isinstance(node.get("type"), str) \
                or not isinstance(node.get("params", {}), dict):
            raise GraphFileError(f"{where}: node {index} needs a string 'id' and 'type' and an object 'params'")
        for key in ("inputShape", "outputShape"):
            if not _is_shape(node.get(key)):
                raise GraphFileError(f"{where}: node {node['id']!r}: {key} must be a list of whole numbers or null")
        if not isinstance(node.get("scope", ""), str) or not _is_count(node.get("paramCount", 0)):
            raise GraphFileError(f"{where}: node {node['id']!r}: scope must be a string and paramCount a count")
        ids.add(node["id"])
    for key in ("params", "trainableParams", "flops", "activationBytes", "largestActivationBytes", "layers"):
        if not _is_count(totals.get(key)):
            raise GraphFileError(f"{where}: totals.{key} must be a whole number >= 0 or null")
    if not _is_count(graph.get("batchSize")) or not isinstance(graph.get("runs", True), bool):
        raise GraphFileError(f"{where}: batchSize must be a whole number >= 0 or null and runs true or false")
    for key in ("blockers", "unusedParams"):
        value = graph.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise GraphFileError(f"{where}: {key} must be a list of strings")
    if not isinstance(graph.get("opaque", {}), dict) or not isinstance(graph.get("name", ""), (str, type(None))):
        raise GraphFileError(f"{where}: opaque must be an object and name a string")
    for index, edge in enumerate(edges):
        if not isinstance(edge, dict) or edge.get("source") not in ids or edge.get("target") not in ids:
            raise GraphFileError(f"{where}: edge {index} must join two node ids of the graph")
    return graph


def read_graph(path: str | Path) -> dict[str, Any]:
    """Read and validate a `.neurarch.json` file."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:  # bounded: `--base /dev/zero` is refused, not read forever
            data = handle.read(MAX_GRAPH_FILE_BYTES + 1)
    except OSError as exc:
        raise GraphFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_GRAPH_FILE_BYTES:
        raise GraphFileError(f"{path} is larger than {MAX_GRAPH_FILE_BYTES} bytes, more than a graph file holds")
    try:
        graph = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise GraphFileError(f"{path} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise GraphFileError(f"{path} is not JSON ({exc.msg} at line {exc.lineno})") from None
    return validate_graph(graph, str(path))
