"""TraceRecorder: a listener writing the chronological text trace of a run.

One numbered line per event, indented by nesting depth: block entries with their inputs, every
instruction with its value summary (shape, dtype, abs_sum/min/max), block exits and the calls that
bound their results. Depends on listeners and notation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..runtime.listeners import BlockEvent, InstructionEvent, TraceListener, block_label
from ..schema.notation import describe_value, instruction_text
from ..schema.model import BlockInstruction, ReturnInstruction

__all__ = ["TraceRecorder", "value_summary"]


def value_summary(value: Any) -> str:
    """`torch.float32[2, 256] abs_sum=215.3293 min=-1.2 max=3.4` for tensors; the type (and small value) else."""
    text = describe_value(value)
    if isinstance(value, torch.Tensor):
        if value.numel() and not value.is_complex() and value.layout == torch.strided and value.device.type != "meta":
            data = value.detach()
            if data.dtype == torch.bool:
                data = data.to(torch.int64)
            data = data.double()
            text += (f" abs_sum={data.abs().sum().item():.4f} min={data.min().item():.4f} "
                     f"max={data.max().item():.4f}")
        return text
    if isinstance(value, (bool, int, float)) or value is None:
        return f"{text} {value!r}"
    return text


class TraceRecorder(TraceListener):
    """Records a run as text lines; `save(path)` writes them, `lines` holds them."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def _line(self, depth: int, text: str) -> None:
        self.lines.append(f"[{len(self.lines) + 1:05d}] {'  ' * depth}{text}")

    def on_run_start(self, root, scope) -> None:
        self.lines = []

    def on_block_enter(self, event: BlockEvent) -> None:
        self._line(event.depth, f"ENTER BLOCK {block_label(event.block)}")
        sig = event.block.signature
        if sig is None:
            return
        names = list(sig.params) + ([sig.vararg] if sig.vararg else []) + list(sig.kwonly) + \
            ([sig.kwarg] if sig.kwarg else [])
        for name in names:
            if name in event.frame:
                self._line(event.depth + 1, f"in {name} = {value_summary(event.frame[name])}")

    def on_block_exit(self, event: BlockEvent) -> None:
        result = event.result
        values = result if isinstance(result, tuple) else (result,)
        self._line(event.depth, f"EXIT BLOCK {block_label(event.block)} -> "
                                f"({', '.join(value_summary(v) for v in values)})")

    def on_instruction(self, event: InstructionEvent) -> None:
        instr = event.instruction
        if isinstance(instr, ReturnInstruction):
            return
        if isinstance(instr, BlockInstruction):
            callee = instr.callee_var or instr.block_ref.path or "self"
            if instr.block_ref.method:
                callee += f".{instr.block_ref.method}"
            target = event.block.find(instr.block_ref.path) if not instr.callee_var and instr.block_ref.path else None
            kind = f" [{target.name}]" if target is not None else ""
            text = f"{instr.out_var} = CALL {callee}{kind}"
        else:
            text = instruction_text(instr)
        if event.has_value:
            text += f"  [{value_summary(event.value)}]"
        self._line(event.depth + 1, text)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text("\n".join(self.lines) + "\n")
        return path
