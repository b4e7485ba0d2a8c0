"""What the parse sees of backward: one watched backward pass, where live code ran in the forward.

The schema interprets the forward; a library the forward hands modules to may call them again
while gradients are computed (`torch.utils.checkpoint` recomputes the checkpointed forward,
torchdiffeq's adjoint method runs the ODE function and its own `_PerturbFunc` modules
backwards), and that runs the modules' original forwards. Those libraries are helpers or live
modules of the forward, so where the parse run's coverage has a row (helpers included),
`backward_rows` runs the schema once more with autograd on (floating inputs requiring grad, as in
training; without, if the forward refuses that) and one backward pass from its outputs, watched by
`runtime.backward_watch`: what ran live is returned as coverage rows of `phase` "backward". The
model is put back as it was (`preserved_state`), gradients included. A backward that cannot be
run is said in one row of kind "unwatched", never silently left out.

Depends on the schema, `runtime` and `state_guard`.
"""

from __future__ import annotations

import torch
from torch import nn

from ..runtime.backward_watch import grad_tensors, watch_backward
from ..runtime.program import Program
from ..schema.model import ModelBlockSchema
from .state_guard import preserved_state

__all__ = ["backward_rows"]


def _inputs(scope: dict, grad: bool) -> dict:
    out = {}
    for name, value in scope.items():
        if isinstance(value, torch.Tensor):
            value = value.detach().clone()
            if grad and (value.is_floating_point() or value.is_complex()):
                value.requires_grad_(True)
        out[name] = value
    return out


def _unwatched(why: str) -> dict:
    return {"module": "", "module_type": "", "kind": "unwatched", "callee": "", "via": "", "block": "",
            "location": "", "calls": 0, "phase": "backward",
            "reason": f"the parse could not watch a backward pass ({why}); to see what backward runs, run "
                      "capture_run(..., coverage=True), call backward on its outputs and read record.coverage()"}


def backward_rows(model: nn.Module, root: ModelBlockSchema, scope: dict) -> list:
    """Coverage rows (phase "backward") of what one backward pass through the schema's outputs ran
    live; none when the parse run's coverage is empty (nothing handed modules to other code)."""
    if not root.live_calls or root.skip_reason is not None:
        return []
    if torch.is_inference_mode_enabled():
        return [_unwatched("the parse ran under torch.inference_mode, where autograd records nothing")]
    grads = {param: param.grad for param in model.parameters()}
    saved = {param: grad.clone() for param, grad in grads.items() if grad is not None}
    rows: list = []
    error = None
    try:
        for grad in (True, False):
            rows.clear()
            try:
                with preserved_state(model), torch.enable_grad():
                    outputs = Program(root).run_root(_inputs(scope, grad))
                    tensors = [t for t in grad_tensors(outputs) if t.requires_grad]
                    if not tensors or not watch_backward(root, tensors, rows):
                        return []  # nothing a backward pass could start from
                    torch.autograd.backward(tensors, [torch.ones_like(t) for t in tensors])
                return rows
            except Exception as exc:  # noqa: BLE001 - said in the coverage row below
                error = exc
    finally:
        for param, grad in grads.items():  # backward accumulated into them: put back what was there
            if grad is not None:
                with torch.no_grad():
                    grad.copy_(saved[param])
            param.grad = grad
    return [_unwatched(f"{type(error).__name__}: {error}")]
