"""dump_schema: the readable text view of a whole block tree.

Each block prints its header, inputs, outputs, weights, sub-blocks and body, with `-> dtype[shape]`
after every instruction whose result was resolved; compound instructions indent their branches.
Method blocks follow their owner, then every sub-block in order. Depends on schema and notation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .notation import instruction_text
from .model import (
    ControlInstruction,
    FunctionInstruction,
    Instruction,
    ModelBlockSchema,
    ReturnInstruction,
    TryInstruction,
    WithInstruction,
    condition_instructions,
)

__all__ = ["dump_schema", "format_schema", "format_block"]


def _body_lines(body: list[Instruction], indent: int, out: list[str]) -> None:
    pad = "  " * indent
    for instr in body:
        if isinstance(instr, ControlInstruction):
            # the test as it runs: `prepare`, then `condition` (a named test runs nothing: not shown)
            _body_lines(condition_instructions(instr), indent, out)
            out.append(pad + instruction_text(instr))
            _body_lines(instr.body, indent + 1, out)
            if instr.else_body:
                out.append(pad + "ELSE:")
                _body_lines(instr.else_body, indent + 1, out)
            continue
        if isinstance(instr, TryInstruction):
            out.append(pad + "TRY:")
            _body_lines(instr.body, indent + 1, out)
            for classes, name, hbody in zip(instr.handlers, instr.handler_names, instr.handler_bodies):
                names = ", ".join(c.__name__ for c in classes) or "BaseException"
                out.append(pad + f"EXCEPT {names}" + (f" AS {name}" if name else "") + ":")
                _body_lines(hbody, indent + 1, out)
            if instr.else_body:
                out.append(pad + "ELSE:")
                _body_lines(instr.else_body, indent + 1, out)
            if instr.final_body:
                out.append(pad + "FINALLY:")
                _body_lines(instr.final_body, indent + 1, out)
            continue
        if isinstance(instr, WithInstruction):
            out.append(pad + instruction_text(instr))
            _body_lines(instr.body, indent + 1, out)
            continue
        line = pad + instruction_text(instr)
        if instr.resolved is not None and not isinstance(instr, ReturnInstruction):
            line += f"  -> {instr.resolved.describe()}"
        out.append(line)
        if isinstance(instr, FunctionInstruction) and instr.function is not None:
            _body_lines(instr.function.body, indent + 1, out)


def format_block(block: ModelBlockSchema, title: Optional[str] = None) -> str:
    out = [f"=== BLOCK {title or block.name} ==="]
    if block.skip_reason is not None:
        out.append(f"skipped: {block.skip_reason}")
    out.append("inputs:")
    if block.inputs:
        for name, rep in block.inputs.items():
            out.append(f"  - {name} = {rep.describe()}")
    elif block.signature is not None:
        names = block.signature.params + block.signature.kwonly
        out.extend(f"  - {name} = (unresolved)" for name in names)
    else:
        out.append("  (unknown)")
    out.append("outputs:")
    out.extend(f"  - {rep.describe()}" for rep in block.outputs) if block.outputs else out.append("  (unresolved)")
    out.append("weights:")
    if block.weights:
        out.extend(f"  - {name} = {rep.describe()}" for name, rep in block.weights.items())
    else:
        out.append("  (none)")
    out.append("sub-blocks:")
    if block.sub_blocks:
        out.extend(f"  - {key}({child.name})" for key, child in block.sub_blocks.items())
    else:
        out.append("  (none)")
    if block.methods:
        out.append("methods:")
        out.extend(f"  - {key}" for key in block.methods)
    if block.skipped:
        out.append("skipped:")
        out.extend(f"  - {key}: {reason}" for key, reason in block.skipped.items())
    out.append("body:")
    _body_lines(block.body, 1, out)
    return "\n".join(out)


def format_schema(schema: ModelBlockSchema) -> str:
    """The whole tree: the root, its methods, then every sub-block depth first."""
    sections = []

    def visit(block: ModelBlockSchema, title: str) -> None:
        sections.append(format_block(block, title))
        for key, method in block.methods.items():
            sections.append(format_block(method, f"{title}.{key}"))
        for child in block.sub_blocks.values():
            visit(child, f"{child.path} ({child.name})")

    visit(schema, schema.name)
    return "\n\n".join(sections) + "\n"


def dump_schema(schema: ModelBlockSchema, path: Optional[str | Path] = None) -> str:
    """Write the text view of `schema` to `path` (if given) and return it."""
    text = format_schema(schema)
    if path is not None:
        Path(path).write_text(text)
    return text
