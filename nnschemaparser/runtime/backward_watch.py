"""What runs during backward: a live-call detector armed on a run's outputs.

A schema run interprets the forward; autograd may then run Python module code again while it
computes gradients: `torch.utils.checkpoint` recomputes the checkpointed forward (reentrant or
not), torchdiffeq's adjoint method solves an ODE backwards through the module's forward and its
own `_PerturbFunc` modules. That code is the modules' *original* forward (a lent forward is put
back when the run ends), so it runs live. `watch_backward(root, outputs, sink)` puts a pre-hook on
each output's autograd node: when a backward pass reaches one, a `LiveCallDetector` with
`phase="backward"` starts on the thread running it (CPU work runs on the caller's thread, a
device's on that device's autograd thread), and a callback queued on the autograd engine stops it
when that backward pass ends; what it saw is merged into `sink` (coverage rows, `calls` added up
over passes). A detector stopped from another thread than the one it watches switches itself off
at that thread's next Python call.

Depends on torch and `coverage`.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator

import torch

from ..schema.model import ModelBlockSchema
from .coverage import LiveCallDetector, merge_live_calls

__all__ = ["watch_backward", "grad_tensors", "merge_rows"]


def grad_tensors(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """The tensors in `value` (nested lists, tuples, dicts, dataclass-like outputs) that have an
    autograd node: those a backward pass can start from."""
    if depth > 8:
        return
    if isinstance(value, torch.Tensor):
        if value.grad_fn is not None:
            yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from grad_tensors(item, depth + 1)
    elif isinstance(value, dict):
        for item in value.values():
            yield from grad_tensors(item, depth + 1)
    elif hasattr(value, "to_tuple"):  # transformers' ModelOutput
        yield from grad_tensors(value.to_tuple(), depth + 1)


def merge_rows(sink: list, calls: list) -> None:
    """Add live calls to the coverage rows in `sink`, repeats of a region added up."""
    rows = {tuple(row.get(k) for k in ("kind", "module", "module_type", "via", "block", "location", "phase")): row
            for row in sink}
    for call in merge_live_calls(calls):
        row = call.as_row()
        key = tuple(row.get(k) for k in ("kind", "module", "module_type", "via", "block", "location", "phase"))
        if key in rows:
            rows[key]["calls"] += row["calls"]
        else:
            rows[key] = row
            sink.append(row)


def watch_backward(root: ModelBlockSchema, outputs: Any, sink: list) -> int:
    """Arm a backward-phase detector on the autograd nodes of `outputs`; returns how many nodes
    were armed (0: nothing in `outputs` can start a backward pass)."""
    nodes = {id(t.grad_fn): t.grad_fn for t in grad_tensors(outputs)}
    if not nodes:
        return 0
    state: dict = {}

    def stop() -> None:
        detector = state.pop("detector", None)
        if detector is None:
            return
        if threading.get_ident() == state.pop("thread", None):
            detector.__exit__(None, None, None)
        else:  # the engine ran this callback on another thread: the watched one switches itself off
            detector.halt()
        merge_rows(sink, detector.calls)

    def start(grad_outputs: Any) -> None:
        if "detector" in state:
            return  # this pass is already watched (another output's node)
        detector = LiveCallDetector(root, phase="backward")
        state["detector"], state["thread"] = detector, threading.get_ident()
        detector.__enter__()
        torch.autograd.Variable._execution_engine.queue_callback(stop)

    for node in nodes.values():
        node.register_prehook(start)
    return len(nodes)
