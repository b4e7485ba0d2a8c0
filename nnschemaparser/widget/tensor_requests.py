"""The inspector state's tensor-view requests: heatmap slices, run differences, attention heads,
trends, per-layer series and tree colours of the runs' trace steps, computed by `tensor_views`.

`TensorRequests` is a mixin of `InspectorState` (state.py): its methods use the state's `runs`,
`active`, `step_index`, `scope`, `run()`, `compare()` and `viewed` (the (run, trace step) pairs
looked at, kept for the static page, at most MAX_VIEWED). A request that cannot be met raises
`TensorViewError`, which the message handlers report like any NNSchemaError.

Depends on the widget's runs and tensor_views modules and torch; never on state (no import circle).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .attention_calls import recompute_weights
from .runs import RunRecord
from .tensor_views import (_LAYER, MAX_SIDE, TensorViewError, attention_heads, heatmap_diff, heatmap_slice, is_attention,
                           layer_series, node_colours, step_trends, tensor_stat)

__all__ = ["TensorRequests", "MAX_VIEWED"]

MAX_VIEWED = 200  # the steps looked at in the tensor view that a static page keeps heatmaps of


class TensorRequests:
    """Tensor views of an InspectorState's runs (see the module docstring)."""

    viewed: list[tuple[str, int]]

    def _traced(self, record: RunRecord, step: Optional[int], trace_step: Optional[int]) -> Any:
        """The TraceStep of a StepInfo index or a trace step number (default: the current step)."""
        if trace_step is None:
            index = self.step_index if step is None and record is self.active else step
            if index is None:
                index = len(record.steps)
            try:
                row = record.step_row(int(index))
            except KeyError as exc:
                raise TensorViewError(str(exc).strip('"')) from None
            trace_step = row["trace_step"]
            if trace_step is None:
                raise TensorViewError(f"step {row['step']} binds no tensor ({row['shape'] or 'no value'}); "
                                     f"pick a step with a tensor value")
        steps = record.trace.steps
        if not 1 <= int(trace_step) <= len(steps):
            raise TensorViewError(f"run {record.name!r} has trace steps 1..{len(steps)}, not {trace_step}")
        traced = steps[int(trace_step) - 1]
        if traced.tensor.value is None:
            raise TensorViewError(f"trace step {traced.step} kept no value ({traced.omitted or 'omitted'}); "
                                 f"make the inspector with larger limits to see it")
        return traced

    def tensor_view(self, step: Optional[int] = None, run: Optional[str] = None, *, trace_step: Optional[int] = None,
                    dims: Optional[list] = None, index: Optional[list] = None, against: Optional[str] = None,
                    max_side: int = MAX_SIDE) -> dict:
        """A heatmap slice of a step's value (see tensor_views.heatmap_slice); with `against`, the
        difference `this run - against` at the step with the same container id."""
        record = self.run(run)
        traced = self._traced(record, step, trace_step)
        if (record.name, traced.step) not in self.viewed[-MAX_VIEWED:]:
            self.viewed.append((record.name, traced.step))
            del self.viewed[:-MAX_VIEWED]
        if against:
            other = self.run(against)
            try:
                base = other.trace.by_container(traced.container_id)
            except KeyError:
                raise TensorViewError(f"run {other.name!r} has no step {traced.container_id}; the runs took different "
                                     f"paths here") from None
            view = heatmap_diff(base.tensor.value, traced.tensor.value, dims, index, max_side)
            view["against"] = other.name
            view["against_step"] = base.step
        else:
            view = heatmap_slice(traced.tensor.value, dims, index, max_side)
        view.update(run=record.name, trace_step=traced.step, step_index=record.trace_index.get(traced.step),
                    var=traced.out_var, block=traced.block_path, container_id=traced.container_id)
        view["attention"] = is_attention(traced.tensor.value, traced.op_name)
        if not view["attention"] and any(c["block"] == traced.block_path for c in record.attention_calls):
            view["attention_block"] = traced.block_path  # a fused call there: its heads can be recomputed
        return view

    def tokens(self) -> Optional[list[str]]:
        """Labels of the input tokens: the ids of the first sequence of `input_ids`, when there is one."""
        ids = self.scope.get("input_ids")
        if isinstance(ids, torch.Tensor) and ids.dim() in (1, 2) and not ids.is_floating_point():
            return [str(int(t)) for t in (ids if ids.dim() == 1 else ids[0])]
        return None

    def attention_view(self, step: Optional[int] = None, run: Optional[str] = None, *,
                       trace_step: Optional[int] = None, batch: int = 0) -> dict:
        """The per-head attention patterns of a step (tensor_views.attention_heads)."""
        record = self.run(run)
        traced = self._traced(record, step, trace_step)
        tokens = self.tokens() if int(batch) == 0 else None
        view = attention_heads(traced.tensor.value, traced.op_name, batch, tokens)
        view.update(run=record.name, trace_step=traced.step, var=traced.out_var, block=traced.block_path)
        return view

    def recomputed_attention(self, block: str, run: Optional[str] = None, call: int = -1) -> dict:
        """The attention weights of the attention call in block `block` (a path, or its end after a dot),
        recomputed from that call's own query, key, mask and scale (attention_calls.py): the last call
        there in the run (or number `call`), as {"weights": [batch, heads, q, k] tensor, "tokens",
        "recomputed": True, "function", "step", "block", "run", "note"}."""
        record = self.run(run)
        if not isinstance(block, str) or not block.strip():
            raise TensorViewError("attention heads need a block path, e.g. 'model.layers.0.self_attn'")
        block = block.strip()
        calls = [c for c in record.attention_calls if c["block"] == block or c["block"].endswith("." + block)]
        if not calls:
            seen = sorted({c["block"] for c in record.attention_calls})
            raise TensorViewError(
                f"run {record.name!r} made no attention call in {block!r} so far"
                + (f"; it made them in {', '.join(seen[:4])}{'...' if len(seen) > 4 else ''}" if seen else
                   "; step or continue past the block's attention call first (the calls recognised are "
                   "scaled_dot_product_attention and functions named *attention_forward)"))
        if len({c["block"] for c in calls}) > 1:
            raise TensorViewError(f"{block!r} names {len({c['block'] for c in calls})} blocks; give the full path")
        if isinstance(call, bool) or not isinstance(call, int) or not -len(calls) <= call < len(calls):
            raise TensorViewError(f"block {calls[0]['block']!r} made {len(calls)} attention calls, there is no call {call!r}")
        chosen = calls[call]
        weights = recompute_weights(chosen)
        notes = [f"recomputed from the {chosen['function']} call's query, key, "
                 f"{'mask' if chosen['mask'] is not None else 'causal mask' if chosen['causal'] else 'no mask'} and scale"]
        if chosen["training"] and chosen["dropout"]:
            notes.append(f"the module was in training mode: dropout {chosen['dropout']} is not replayed")
        return {"weights": weights, "tokens": self.tokens(), "recomputed": True, "function": chosen["function"],
                "step": chosen["step"], "block": chosen["block"], "run": record.name, "note": "; ".join(notes)}

    def recomputed_attention_view(self, block: str, run: Optional[str] = None, batch: int = 0) -> dict:
        """The browser's per-head patterns (tensor_views.attention_heads) of `recomputed_attention`."""
        result = self.recomputed_attention(block, run)
        tokens = result["tokens"] if int(batch) == 0 else None
        view = attention_heads(result["weights"], "scaled_dot_product_attention", batch, tokens)
        view.update(run=result["run"], block=result["block"], step_index=result["step"], recomputed=True,
                    reason=result["note"], fused=result["function"] != "eager_attention_forward")
        return view

    def trends(self, run: Optional[str] = None, stat: str = "norm") -> dict:
        """Per variable, a stat across the run's trace steps (tensor_views.step_trends)."""
        record = self.run(run)
        return {"run": record.name, **step_trends(record.trace.steps, stat)}

    def tree_colours(self, run: Optional[str] = None, stat: str = "norm", against: Optional[str] = None) -> dict:
        """A number per tree node of a run: a stat of its last value, or with `against`, the max |diff|
        from that run at the same step (tensor_views.node_colours)."""
        record = self.run(run)
        if against:
            result = self.compare(against, record.name)
            by_step = {row["step_b"]: row["max_abs_diff"] for row in result["rows"]
                       if row["step_b"] is not None and isinstance(row["max_abs_diff"], float)}
            what = f"max |{record.name} - {result['a']}|"
        else:
            tensor_stat(None, stat)  # an unknown stat is refused before any work
            by_step = {step.step: tensor_stat(step.tensor.value, stat) for step in record.trace.steps}
            what = stat
        return {"run": record.name, **node_colours(record.steps, by_step, what, self.tree.statement_nodes)}

    def layers(self, var: str, stat: str = "norm", runs: Optional[list] = None) -> dict:
        """The stat of `var` after each layer of a ModuleList, for each run (default: every run)."""
        records = [self.run(name) for name in runs] if runs else [r for r in self.runs if r.trace.steps]
        series = []
        for record in records:
            running = [] if record.finished else [path for path, _ in record.block_stack]
            try:
                item = layer_series(record.trace.steps, var, stat, running)
            except TensorViewError:
                if record.finished or not series:
                    raise
                continue  # a paused run that has not finished a layer yet: no points of its own
            series.append({"run": record.name, "finished": record.finished, **item})
        prefixes = {s["prefix"] for s in series}
        axis: list[int] = []
        for prefix in prefixes:  # every layer of the list, so a partial run's points sit at their numbers
            axis += [int(p[len(prefix) + 1:]) for p in self.tree.path_nodes
                     if p.startswith(prefix + ".") and p[len(prefix) + 1:].isdigit()]
        return {"var": var, "stat": stat, "series": series, "axis": sorted(set(axis))}

    # -- the same statement in every layer of a repeated block ----------------------------------

    def same_statement(self, node: int, runs: Optional[list] = None, var: Optional[str] = None) -> dict:
        """Tree row `node` (a statement or instruction inside a layer `prefix.N` of a ModuleList)
        and its counterpart in every other layer of that list: the value each bound there, per run
        (default: every run), as {layers, nodes, runs: [{run, cells: [{trace_step, var, shape,
        stats} or None per layer]}]}. A statement binding several variables shows `var` (default: the
        first named one it binds, in the layer's last run of it). A layer whose row differs (another
        forward) gets no node; a layer the run has not reached yet gets None."""
        tree = self.tree
        if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < len(tree):
            raise TensorViewError(f"there is no tree node {node!r}; the tree has nodes 0..{len(tree) - 1}")
        chain = tree.ancestors(node) + [node]
        layer_node, prefix = -1, ""
        for candidate in reversed(chain):
            match = _LAYER.match(tree.block_path(candidate)) if tree.nodes[candidate].kind == "B" else None
            if match is not None:
                layer_node, prefix = candidate, match["prefix"]
                break
        if layer_node < 0:
            raise TensorViewError(f"row {node} is not inside a layer of a ModuleList (a block path ending in .N); "
                                  "pick a statement of a repeated block such as model.layers.0")
        steps_down = []  # the child positions from the layer block down to the row
        for parent, child in zip(chain[chain.index(layer_node):], chain[chain.index(layer_node) + 1:]):
            steps_down.append(tree.nodes[parent].children.index(child))
        layers = sorted(int(p[len(prefix) + 1:]) for p in tree.path_nodes
                        if p.startswith(prefix + ".") and p[len(prefix) + 1:].isdigit())
        own = tree.nodes[node]
        nodes: list[int] = []
        for k in layers:
            at = tree.path_nodes[f"{prefix}.{k}"]
            for position in steps_down:
                children = tree.nodes[at].children
                at = children[position] if position < len(children) else -1
                if at < 0:
                    break
            same = at >= 0 and tree.nodes[at].kind == own.kind and tree.nodes[at].text == own.text
            nodes.append(at if same else -1)
        records = [self.run(name) for name in runs] if runs else list(self.runs)
        holders = tree.statement_nodes
        wanted = {n: i for i, n in enumerate(nodes) if n >= 0}
        out_runs = []
        for record in records:
            bound: dict[int, dict[str, int]] = {}  # layer position -> var -> its last trace step in this run
            ran: set[int] = set()  # layer positions whose row ran in this run (a tensor bound or not)
            for row in record.steps:
                at, trace_step = row["node"], row["trace_step"]
                if at is None or at < 0:
                    continue
                position = wanted.get(at, wanted.get(holders.get(at, -1)))
                if position is None:
                    continue
                ran.add(position)
                if trace_step is not None:
                    bound.setdefault(position, {})[row["var"] or ""] = trace_step
            cells = []
            for position in range(len(layers)):
                names = bound.get(position, {})
                if var is not None:
                    trace_step = names.get(var)
                else:
                    named = [n for n in names if n and not n.startswith("$")]
                    trace_step = names[named[0]] if named else (max(names.values()) if names else None)
                if trace_step is None:  # a row that ran but bound no tensor says so (not "not run yet")
                    cells.append({"ran": True, "note": "no tensor"} if position in ran else None)
                    continue
                traced = record.trace.steps[trace_step - 1]
                value = traced.tensor.value
                cell = {"trace_step": trace_step, "var": traced.out_var, "block": traced.block_path,
                        "shape": list(value.shape) if isinstance(value, torch.Tensor) else None}
                if isinstance(value, torch.Tensor) and value.numel() and not value.is_complex():
                    data = value.detach().to(device="cpu", dtype=torch.float64)
                    cell["stats"] = {"mean": float(data.mean()), "std": float(data.std()) if data.numel() > 1 else 0.0,
                                     "min": float(data.min()), "max": float(data.max()),
                                     "norm": float(torch.linalg.vector_norm(data))}
                cells.append(cell)
            out_runs.append({"run": record.name, "finished": record.finished, "cells": cells})
        return {"node": node, "text": tree.source_words(node), "prefix": prefix, "layers": layers,
                "nodes": nodes, "runs": out_runs, "var": var}
