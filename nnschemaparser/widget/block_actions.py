"""Views one action away from a block row (issue 42, point 3): "output" runs the active run to the
tensor the block returns (its first tensor when it returns a tuple, as attention blocks do), from
which "heads" (the block's attention heads) and "every layer" (the statement that bound it, in every
layer of its ModuleList) follow.

`run_to_output(state, node)` stops the run at the block's next return, as a one-time breakpoint (the
other breakpoints still stop it on the way; from the start when the run is over or has passed the
block already), and says which trace step holds the returned tensor and which statement bound it.

Depends on the interpreter's StepInfo, the schema's ReturnInstruction and the widget's debugger.
"""

from __future__ import annotations

from typing import Any

import torch

from ..schema.model import ReturnInstruction
from .debugger import Breakpoint

__all__ = ["run_to_output", "block_output"]


def _check_block(state: Any, node: int) -> str:
    tree = state.tree
    if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < len(tree) or tree.nodes[node].kind != "B":
        raise state.navigation_error(f"'output' needs a block row (a search result or tree row of a block); "
                                     f"tree node {node!r} is not one")
    return tree.block_path(node)


def run_to_output(state: Any, node: int) -> dict:
    """Run the active run to the return of block `node` and describe its output (`block_output`); a run
    paused there already stays (so "heads" after "output" runs nothing). The target is no breakpoint:
    it leaves no hit."""
    path = _check_block(state, node)
    step = state.current
    if state.status == "paused" and state.pause is None and step is not None and step.block_path == path and \
            isinstance(step.instruction, ReturnInstruction):
        return block_output(state, node)  # there already ("heads" after "output"): nothing to run
    state._new_action()
    record = state.active
    passed = any(row["block"] == path and row["kind"] == "return" for row in record.steps)
    if passed or state.status in ("finished", "error"):
        state.reset()  # the block returned already: its output again, from the start (same edits)

    def returns(step: Any) -> bool:
        return step.block_path == path and isinstance(step.instruction, ReturnInstruction)

    bps = state.breakpoints
    version, hits = bps.version, len(bps.hits)
    target = Breakpoint("when", when=returns, label=f"the output of {path}")
    bps.items.append(target)
    try:
        while state._advance_checked():
            pass
    finally:
        bps.items.remove(target)
        bps.version = version + 1
        if len(bps.hits) > hits and bps.hits[-1]["label"] == target.label:
            bps.hits.pop()  # where the run was sent is no breakpoint hit
    if state.status == "finished":
        state.stop_reason = f"target not reached: {path} did not return in this run (the run finished)"
        return {"block": path, "trace_step": None}
    if state.stop_reason == f"the output of {path} is true":
        state.stop_reason = f"returned from {path}"
    return block_output(state, node)


def block_output(state: Any, node: int) -> dict:
    """Where the paused run stands, if it is at the return of block `node`: the trace step of the tensor
    it returns (the first tensor of a tuple), its variable, and the statement row that bound it."""
    path = _check_block(state, node)
    step = state.current
    out = {"block": path, "run": state.active.name, "trace_step": None, "var": "", "statement": -1}
    if step is None or step.block_path != path or not isinstance(step.instruction, ReturnInstruction):
        return out
    instr = step.instruction
    values = step.value if len(instr.out_vars) > 1 and isinstance(step.value, (tuple, list)) else (step.value,)
    for var, value in zip(instr.out_vars, values):
        if isinstance(value, torch.Tensor):
            trace_step = state._driver.log.trace_step_of(step.frame_depth, var)
            if trace_step is None:
                continue
            index = state.active.trace_index.get(trace_step)
            row_node = state.active.step_row(index)["node"] if index else -1
            out.update(trace_step=trace_step, var=var, step_index=index,
                       statement=state.tree.shown_row(row_node) if row_node is not None and row_node >= 0 else -1)
            break
    return out
