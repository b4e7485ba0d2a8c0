"""Edits the inspector applies to a paused step's value: zero, scale, add noise, or a Python expression.

An edited tensor keeps the `requires_grad` of the value it replaces: scale and noise stay on the
autograd graph, and a value that does not depend on the old one (zero, most expressions) becomes a
leaf that requires grad when the old value did, so the gradients of the run flow through every edit.

An `EditSpec` is the queued, replayable form of one edit: the step it belongs to (the stream is
deterministic, so the step index is a stable fork key), the variable and frame it targets, the
action and its argument. `apply_edit_spec` turns it into a new value for the live step and hands it
to `StepInfo.edit`, which checks shape and dtype; any failure raises `EditError` and changes nothing.

Depends on interpreter (StepInfo) and errors; knows nothing about widgets.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional

import torch

from ..schema.errors import EditError
from ..runtime.interpreter import StepInfo

__all__ = ["EditSpec", "EDIT_ACTIONS", "apply_edit_spec", "parse_edit"]

EDIT_ACTIONS = ("zero", "scale", "noise", "expression")
#: The longest expression an edit accepts (a longer text is refused before it is compiled).
MAX_EXPRESSION_CHARS = 10_000


@dataclass(frozen=True)
class EditSpec:
    """One edit, queued at `step_index` on `out_var` of frame `frame_depth`.

    `argument`: the factor for "scale", the standard deviation for "noise" (drawn from its own
    generator seeded with `seed`, so a replay draws the same noise), the source text for "expression"
    (evaluated with `value`, `torch`, `F`, the frame's variables and the notebook's names in scope).
    """

    step_index: int
    action: str
    out_var: str
    frame_depth: int
    argument: Any = None
    seed: int = 0

    def describe(self) -> str:
        what = {"zero": "zero", "scale": f"scale by {self.argument}", "noise": f"add noise (std {self.argument})",
                "expression": f"set to {self.argument}"}.get(self.action, self.action)
        return f"step {self.step_index}: {self.out_var} ← {what}"

    def to_dict(self) -> dict:
        data = asdict(self)
        data["text"] = self.describe()
        return data


def parse_edit(step: StepInfo, action: str, argument: Any = None, seed: int = 0) -> EditSpec:
    """An EditSpec for the variable `step` bound, after checking the action and its argument."""
    if action not in EDIT_ACTIONS:
        raise EditError(f"unknown edit action {action!r}; use one of {', '.join(EDIT_ACTIONS)}")
    if not step.out_var:
        raise EditError(f"step {step.step_index} ({step.kind}) binds no variable; edit a step that binds one")
    if action in ("scale", "noise"):
        try:
            argument = float(argument)
        except (TypeError, ValueError):
            name = "factor" if action == "scale" else "standard deviation"
            raise EditError(f"{action} needs a number (the {name}), got {argument!r}") from None
        if not math.isfinite(argument):
            raise EditError(f"{action} needs a finite number, got {argument!r}")
        if action == "noise" and argument < 0:
            raise EditError(f"noise needs a standard deviation >= 0, got {argument}")
    elif action == "expression":
        if not isinstance(argument, str) or not argument.strip():
            raise EditError("expression needs Python source text, e.g. 'torch.zeros_like(value)' or 'value * 2'")
        argument = argument.strip()
        if len(argument) > MAX_EXPRESSION_CHARS:
            raise EditError(f"the expression is {len(argument)} characters, more than {MAX_EXPRESSION_CHARS}; "
                            "define a function in the notebook and call it")
        try:
            compile(argument, "<edit>", "eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            raise EditError(f"the expression {_short(argument)} does not parse: "
                            f"{getattr(exc, 'msg', None) or type(exc).__name__}") from None
    else:
        argument = None
    return EditSpec(step_index=step.step_index, action=action, out_var=step.out_var,
                    frame_depth=step.frame_depth, argument=argument, seed=seed)


def _new_value(spec: EditSpec, current: Any, step: StepInfo, namespace: Optional[Mapping[str, Any]]) -> Any:
    if spec.action == "expression":
        scope = dict(namespace or {})
        scope.update(step.scope_frames[spec.frame_depth])
        scope.update({"torch": torch, "F": torch.nn.functional, "value": current, "step": step})
        try:
            new = eval(compile(spec.argument, "<edit>", "eval"), scope)  # noqa: S307 - the user's own kernel
        except SystemExit as exc:  # never the kernel's exit: the edit fails and says so
            raise EditError(f"the expression {_short(spec.argument)} called sys.exit({exc.code!r}); "
                            "nothing was changed") from None
        except KeyboardInterrupt:
            raise EditError(f"the expression {_short(spec.argument)} was interrupted; nothing was changed") from None
        except Exception as exc:
            raise EditError(f"the expression {_short(spec.argument)} raised {type(exc).__name__}: "
                            f"{str(exc)[:300]}") from None
        return _same_requires_grad(new, current)
    if not isinstance(current, torch.Tensor):
        raise EditError(f"{spec.action} works on tensors; {spec.out_var!r} is a {type(current).__name__} "
                        "(use an expression to set it)")
    if spec.action == "zero":
        return _same_requires_grad(torch.zeros_like(current), current)
    if not current.is_floating_point():
        raise EditError(f"{spec.action} needs a floating-point tensor; {spec.out_var!r} is {current.dtype} "
                        "(use an expression to set it)")
    # Scale and noise stay on the autograd graph: the gradient flows through the edit to what came before.
    if spec.action == "scale":
        return current * spec.argument
    generator = torch.Generator(device=current.device).manual_seed(spec.seed)
    noise = torch.randn(current.shape, generator=generator, device=current.device, dtype=current.dtype)
    return current + noise * spec.argument


def _short(text: str, limit: int = 120) -> str:
    """`text` quoted for a message, cut to `limit` characters."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} characters)"


def _same_requires_grad(new: Any, current: Any) -> Any:
    """`new` with the `requires_grad` of the value it replaces, so gradients flow from the edit on.

    A value that does not depend on the old one (zeros, a constant expression) becomes a leaf that
    requires grad: the later steps' gradients reach it, and the steps before it honestly get none.
    """
    if not isinstance(new, torch.Tensor) or not isinstance(current, torch.Tensor):
        return new
    if current.requires_grad and not new.requires_grad and (new.is_floating_point() or new.is_complex()):
        return new.detach().requires_grad_(True)
    if not current.requires_grad and new.requires_grad:
        return new.detach()
    return new


def apply_edit_spec(step: StepInfo, spec: EditSpec, namespace: Optional[Mapping[str, Any]] = None) -> Any:
    """Apply `spec` to the paused `step`; returns the new value. Raises EditError and changes nothing on failure."""
    if spec.step_index != step.step_index:
        raise EditError(f"the edit belongs to step {spec.step_index}, the run is at step {step.step_index}")
    frames = step.scope_frames
    if not 0 <= spec.frame_depth < len(frames) or spec.out_var not in frames[spec.frame_depth]:
        raise EditError(f"step {step.step_index}: the edit targets {spec.out_var!r} in frame {spec.frame_depth}, "
                        f"which this run does not have there (it bound {step.out_var!r}); the control path "
                        "changed — remove the edit or queue it at another step")
    current = frames[spec.frame_depth][spec.out_var]
    value = _new_value(spec, current, step, namespace)
    step.edit(values=value, frame_depth=spec.frame_depth, out_var=spec.out_var)
    return value
