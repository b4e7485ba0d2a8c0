"""The JSON graph of an inspection run: nodes with shapes, parameters and FLOPs, edges of real data flow.

    {"format": "nnschemaparser-graph/1", "name": ..., "nodes": [...], "edges": [...], "totals": {...},
     "blocks": [...]}

A node is a model input (`kind: "input"`), an op (`"op"`, or `"module"` for a child run eagerly as
one piece), a tensor the run did not see being made (`"constant"`), or the model's single output
node (`"output"`). Its `id` is the op's unique module-qualified name (`linear1.linear`), `name`
the source variable it was bound to, `op` its type, `block_path` the module it ran in. Shapes are
full shapes, batch dimension included. Edges go from the producer of a tensor to each op that read
it (`output_idx`: the producer's output slot, `input_idx`: the reader's input position; null at the
end of a merged module node, see `depth`); parameters
and buffers are not edges, they are counted in `params` of the first node that reads them, so a
weight shared by two layers counts once. `totals` are torch's numbers: every parameter of the model
once, and the FLOPs FlopCounterMode counted for the run, which the nodes' FLOPs add up to.

With `depth=N`, every module N levels below the root becomes one `"module"` node per call (id: its path,
`@1`, `@2` for later calls), holding its own ops and those of everything inside it (`depth=0`: the
whole model is one node, `<root>`); FLOPs and parameters add up the same.

Depends on inspector, dataflow, flops and metadata; never on the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from torch.nn.parameter import is_lazy

from .dataflow import OpInfo
from .flops import block_parameter_counts, count_parameters
from .inspector import ModelInspector
from .metadata import ROOT_PATH, inspect_model

__all__ = ["build_graph", "write_graph", "GRAPH_FORMAT"]

GRAPH_FORMAT = "nnschemaparser-graph/1"


def _shape(repr_: Any) -> tuple[list[int], str]:
    if repr_ is None:
        return [], ""
    return list(repr_.shape), repr_.dtype


def _location(op: OpInfo) -> dict[str, Any]:
    if op.location is None:
        return {"location": None, "code": None}
    return {"location": str(op.location), "code": op.location.code.strip() or None}


class _Builder:
    def __init__(self, inspector: ModelInspector, depth: Optional[int]) -> None:
        self.inspector = inspector
        self.flow = inspector.flow
        self.depth = depth
        model = inspector.model
        self.param_sizes = {name: 0 if is_lazy(p) else int(p.numel()) for name, p in model.named_parameters()}
        self.buffer_names = {name for name, _ in model.named_buffers()}
        self.nodes: list[dict[str, Any]] = []
        self.node_ids: set[str] = set()
        self.edges: list[dict[str, Any]] = []
        self.edge_keys: set[tuple] = set()
        self.group_of: dict[str, str] = {}

    def add_node(self, node: dict[str, Any]) -> dict[str, Any]:
        self.nodes.append(node)
        self.node_ids.add(node["id"])
        return node

    def add_edge(self, source: str, target: str, output_idx: Optional[int], input_idx: Optional[int]) -> None:
        if source in self.group_of or target in self.group_of:
            # Slots of the merged ops say nothing about the merged node: leave them out.
            output_idx = None if source in self.group_of else output_idx
            input_idx = None if target in self.group_of else input_idx
        source, target = self.group_of.get(source, source), self.group_of.get(target, target)
        if source == target:
            return
        key = (source, target) if self.depth is not None else (source, target, output_idx, input_idx)
        if key in self.edge_keys:
            return
        self.edge_keys.add(key)
        self.edges.append({"source": source, "target": target, "output_idx": output_idx, "input_idx": input_idx})

    def op_params(self) -> dict[str, tuple[int, list[str]]]:
        """Per op: elements of the parameters it is the first to read, and the names of all it reads."""
        claimed: set[str] = set()
        out = {}
        for op in self.flow.ops:
            new = [s for s in op.states if s in self.param_sizes and s not in claimed]
            claimed.update(new)
            out[op.op_name] = (sum(self.param_sizes[s] for s in new), list(op.states))
        return out

    def groups(self) -> dict[int, list[OpInfo]]:
        """Ops merged into the call of their depth-N module, by call index."""
        merged: dict[int, list[OpInfo]] = {}
        if self.depth is None:
            return merged
        for op in self.flow.ops:
            # An eagerly run child at depth N has no call record: it is already one node.
            if op.depth >= self.depth and len(op.call_chain) > self.depth:
                merged.setdefault(op.call_chain[self.depth], []).append(op)
        return merged

    def build(self) -> tuple[list, list]:
        for port in self.flow.inputs:
            shape, dtype = _shape(port.repr)
            self.add_node({"id": port.name, "kind": "input", "name": port.var_name, "op": "input", "block_path": "",
                           "shape": shape, "dtype": dtype, "params": 0, "flops": 0})
        params = self.op_params()
        merged = self.groups()
        call_ids = {}
        op_names = {op.op_name for op in self.flow.ops}
        for index in merged:
            call = self.flow.calls[index]
            base = call.module_name or ROOT_PATH
            node_id, n = base, 1
            while node_id in op_names or node_id in call_ids.values() or node_id in self.node_ids:
                node_id, n = f"{base}@{n}", n + 1
            call_ids[index] = node_id
            for op in merged[index]:
                self.group_of[op.op_name] = node_id
        emitted: set[int] = set()
        for op in self.flow.ops:
            group = self.group_of.get(op.op_name)
            if group is None:
                shape, dtype = _shape(op.output_reprs[0] if op.output_reprs else None)
                count, names = params[op.op_name]
                self.add_node({"id": op.op_name, "kind": op.kind, "name": op.var_name, "op": op.op_type,
                               "block_path": op.module_name, "module_type": op.module_type, "shape": shape,
                               "dtype": dtype, "outputs": [{"shape": list(r.shape), "dtype": r.dtype}
                                                           for r in op.output_reprs],
                               "params": count, "param_names": names, "flops": op.flops, **_location(op)})
                continue
            index = op.call_chain[self.depth]
            if index in emitted:
                continue
            emitted.add(index)
            call, members = self.flow.calls[index], merged[index]
            shape, dtype = _shape(call.output_reprs[0] if call.output_reprs else None)
            self.add_node({"id": call_ids[index], "kind": "module", "name": call.var_name, "op": call.class_name,
                           "block_path": call.module_name, "module_type": call.module_type, "shape": shape,
                           "dtype": dtype, "outputs": [{"shape": list(r.shape), "dtype": r.dtype}
                                                       for r in call.output_reprs],
                           "params": sum(params[m.op_name][0] for m in members),
                           "param_names": list(dict.fromkeys(n for m in members for n in params[m.op_name][1])),
                           "flops": sum(m.flops for m in members), "ops": len(members)})
        for op in self.flow.ops:
            for position, edge in enumerate(op.inputs):
                if edge.is_state:
                    continue
                self.ensure_source(edge.source, edge.producer is None)
                self.add_edge(edge.source, op.op_name, edge.output_idx, position)
        outputs = self.flow.outputs
        first = outputs[0].repr if outputs else None
        shape, dtype = _shape(first)
        self.add_node({"id": "output", "kind": "output", "name": "", "op": "output", "block_path": "",
                       "shape": shape, "dtype": dtype,
                       "outputs": [{"shape": list(p.repr.shape), "dtype": p.repr.dtype} for p in outputs],
                       "params": 0, "flops": 0})
        for position, port in enumerate(outputs):
            if port.source is None:
                continue
            self.ensure_source(port.source.source, port.source.producer is None or port.source.is_state)
            self.add_edge(port.source.source, "output", port.source.output_idx, position)
        return self.nodes, self.edges

    def ensure_source(self, name: str, pseudo: bool) -> None:
        """Give an untracked tensor (or a state read as data) a node of its own the first time."""
        if not pseudo or name in self.node_ids:
            return
        kind = "state" if name in self.param_sizes or name in self.buffer_names else "constant"
        self.add_node({"id": name, "kind": kind, "name": name, "op": kind, "block_path": "", "shape": [], "dtype": "",
                       "params": 0, "flops": 0})


def build_graph(inspector: ModelInspector, *, name: Optional[str] = None, target: Optional[str] = None,
                depth: Optional[int] = None, inputs: Optional[list[str]] = None) -> dict[str, Any]:
    """The graph of `inspector`'s run as a JSON-ready dict; `depth` merges deeper modules (see module doc)."""
    if depth is not None and (not isinstance(depth, int) or depth < 0):
        raise ValueError(f"depth must be a whole number >= 0 (0 keeps only the root), got {depth!r}")
    nodes, edges = _Builder(inspector, depth).build()
    model = inspector.model
    flow = inspector.flow
    metadata = {m.path: m for m in inspect_model(model).modules}
    subtree = block_parameter_counts(model)
    block_flops: dict[str, int] = {}
    for op in flow.ops:
        parts = op.module_name.split(".") if op.module_name else []
        for cut in range(len(parts) + 1):
            prefix = ".".join(parts[:cut])
            block_flops[prefix] = block_flops.get(prefix, 0) + op.flops
    blocks = []
    for path, _ in model.named_modules():
        meta = metadata.get(path or ROOT_PATH)
        info = flow.modules.get(path)
        blocks.append({"path": path, "type": meta.module_type if meta else "", "params": subtree[path],
                       "direct_params": meta.direct_parameters if meta else 0,
                       "buffers": meta.direct_buffers if meta else 0, "flops": block_flops.get(path, 0),
                       "calls": info.calls if info else 0, "skipped": info.skipped if info else None})
    totals = {
        "params": count_parameters(model),
        "trainable_params": count_parameters(model, trainable_only=True),
        "params_read": sum(n["params"] for n in nodes),
        "flops": inspector.total_flops,
        "activation_bytes": sum(op.output_bytes for op in flow.ops),
        "nodes": len(nodes),
        "edges": len(edges),
    }
    return {
        "format": GRAPH_FORMAT,
        "name": name or inspector.schema.name,
        "target": target,
        "model_type": inspector.schema.module_type,
        "inputs": inputs if inputs is not None else [f"{p.var_name}={p.repr.describe()}" for p in flow.inputs],
        "depth": depth,
        "nodes": nodes,
        "edges": edges,
        "totals": totals,
        "blocks": blocks,
        "skipped": dict(inspector.schema.skipped),
    }


def write_graph(graph: dict[str, Any], path: str | Path) -> Path:
    """Write `graph` as indented JSON to `path` and return the path."""
    path = Path(path)
    path.write_text(json.dumps(graph, indent=1) + "\n")
    return path
