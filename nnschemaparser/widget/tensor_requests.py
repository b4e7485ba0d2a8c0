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

from .runs import RunRecord
from .tensor_views import (MAX_SIDE, TensorViewError, attention_heads, heatmap_diff, heatmap_slice, is_attention,
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
            item = layer_series(record.trace.steps, var, stat)
            series.append({"run": record.name, **item})
        return {"var": var, "stat": stat, "series": series}
