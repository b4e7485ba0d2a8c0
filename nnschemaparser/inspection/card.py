"""The card: a short boxed summary of one inspected model, to paste into a review or a chat.

    +------------------------------------------------------------------+
    | MyModel                                         models/m001.py   |
    | 3 modules, 325 params, 600 FLOPs at x: 1x10 float32              |
    +------------------------------------------------------------------+
    | Runs         yes, end to end; output equals eager bit for bit    |
    | Blockers     none                                                |
    | Activations  180 B (op outputs, views not counted)               |
    +------------------------------------------------------------------+

Blockers are the children the schema cannot express and re-dispatches to their real module (the
model still runs; those parts are opaque to stepping and editing). Plain ASCII, fixed width; a long
row wraps onto three lines at most, then is cut with "...". A model whose forward fails gets a card
too (`format_failure_card`), saying so. Depends on inspector, flops and metadata only.
"""

from __future__ import annotations

import re
import textwrap
from typing import Optional

from torch import nn

from .flops import format_count
from .inspector import ModelInspector
from .metadata import inspect_model

__all__ = ["format_card", "format_failure_card", "format_bytes"]

_LABEL = 13


def format_bytes(count: int) -> str:
    """`180 B`, `1.5 KB`, `3.2 MB` (powers of 1024)."""
    value = float(count)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"  # pragma: no cover - unreachable


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _input_text(inspector: ModelInspector) -> str:
    parts = []
    for port in inspector.flow.inputs:
        shape = "x".join(str(d) for d in port.repr.shape) or "scalar"
        parts.append(f"{port.var_name}: {shape} {port.repr.dtype.replace('torch.', '')}")
    return ", ".join(parts) or "no tensor input"


def _box(head: list[str], rows: list[tuple[str, str]], width: int, label_width: int = _LABEL) -> str:
    """Head lines over a rule, then label/text rows (the plan card uses it too)."""
    inner = width - 4
    if len(head) >= 2 and len(head[0]) + 1 + len(head[1]) <= inner:  # name and source share a line
        head = [head[0] + " " * (inner - len(head[0]) - len(head[1])) + head[1]] + head[2:]
    rule = "+" + "-" * (width - 2) + "+"
    lines = [rule] + [f"| {_fit(text, inner):<{inner}} |" for text in head] + [rule]
    for label, text in rows:
        # A long row wraps onto at most three lines under its label, then is cut.
        parts = textwrap.wrap(text, inner - label_width) or [""]
        if len(parts) > 3:
            parts = parts[:2] + [_fit(" ".join(parts[2:]), inner - label_width)]
        for index, part in enumerate(parts):
            lines.append(f"| {(label if index == 0 else ''):<{label_width}}{part:<{inner - label_width}} |")
    lines.append(rule)
    return "\n".join(lines) + "\n"


def format_card(inspector: ModelInspector, *, name: Optional[str] = None, source: Optional[str] = None,
                matches_eager: Optional[bool] = None, width: int = 68) -> str:
    """The boxed card of `inspector`'s model and run.

    `name` and `source` head the card (default: the class name and its module). `matches_eager`
    says whether the schema's output was compared with the eager forward and found equal (None: not
    compared).
    """
    name = name or inspector.schema.name
    source = source if source is not None else type(inspector.model).__module__
    modules = len(list(inspector.model.modules()))
    head = [name, source, f"{modules} modules, {format_count(inspector.total_parameters)} params, "
                          f"{format_count(inspector.total_flops)} FLOPs at {_input_text(inspector)}"]
    if matches_eager is True:
        runs = "yes, end to end; output equals eager bit for bit"
    elif matches_eager is False:
        runs = "yes, end to end; but the output differs from eager"
    else:
        runs = "yes, end to end"
    rows = [("Runs", runs)]
    skipped = inspector.schema.skipped
    for index, (path, reason) in enumerate(skipped.items()):
        # The reason starts with the forward's file:line; the card keeps the sentence.
        why = re.sub(r"^\S+:\d+: ", "", reason.splitlines()[0] if reason else "")
        rows.append(("Blockers" if index == 0 else "", f"{path}: {why}"))
    if not skipped:
        rows.append(("Blockers", "none"))
    activation = sum(op.output_bytes for op in inspector.ops)
    rows.append(("Activations", f"{format_bytes(activation)} (op outputs, views not counted)"))
    rows.append(("Ops", f"{len(inspector.ops)} ops in {len(inspector.calls)} module calls"))
    return _box(head, rows, width)


def format_failure_card(model: nn.Module, error: BaseException, *, name: Optional[str] = None,
                        source: Optional[str] = None, inputs: str = "", width: int = 68) -> str:
    """The card of a model that does not run on the given inputs: its size and the error, no FLOPs.

    The parameter count comes from `inspect_model`, which needs no forward pass.
    """
    metadata = inspect_model(model)
    name = name or type(model).__name__
    source = source if source is not None else type(model).__module__
    head = [name, source, f"{len(metadata.modules)} modules, {format_count(metadata.total_parameters)} params"
                          + (f", at {inputs}" if inputs else "")]
    message = str(error).strip().splitlines()
    rows = [("Runs", f"no: {type(error).__name__}: {message[0] if message else ''}"),
            ("Blockers", "the forward fails on these inputs")]
    return _box(head, rows, width)
