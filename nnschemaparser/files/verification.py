"""The verification rule of a bound load: a file may run only what the model's own source lowers to.

`verified_schema(document, decoded, model, source)` lowers `model` again with the project's own
parser (`NNParser.parse_model(model, resolve=False)`: nothing runs), encodes that fresh lowering with
the same encoder `save_schema` uses, and requires the file's document to equal it structurally:
the block tree (paths, module types, method blocks, decorators), every function's signature and
defaults, and every instruction — its kind, its call target (an allowlisted name, or a reference to
the same object of the model's code), operands, flags and control-flow bodies (a control
instruction's `prepare` list and its `condition`), recursively. The
first difference is refused with `SourceMismatchError`, naming the block, the instruction's index
path and its file:line.

What runs afterwards is the *fresh* lowering, never an object decoded from the file: from the file
only viewer data is taken — each instruction's `resolved` shape and dtype, each block's `inputs`
and `outputs`, and which blocks the saved schema ran as the real module (`skip_reason`; skipping
only re-dispatches to the model's own module, so a file cannot add behaviour through it).

Ignored when comparing, because they describe rather than run: the `files` table (absolute paths
differ between machines), instruction `location`, a function's `file`, `firstlineno` and `source`
text, the `namespace` of a global reference (the same source file may be imported under another
module name), skip reasons and the `skipped` summary, `resolved`, `inputs` and `outputs`.

Depends on parser (the fresh lowering), schema_codec (the encoder), file_format (the errors) and
schema.
"""

from __future__ import annotations

from typing import Any, Optional

from torch import nn

from .file_format import JSONObject, ModelMismatchError, UnsafeReferenceError, is_array, is_object
from ..parser.model_parser import NNParser, _BlockBuilder, _collect_skipped
from ..schema.errors import SchemaFormatError
from ..schema.model import (
    ControlInstruction,
    FunctionInstruction,
    Instruction,
    ModelBlockSchema,
    TryInstruction,
    WithInstruction,
)
from .schema_codec import SchemaEncoder

__all__ = ["SourceMismatchError", "verified_schema", "lower_model"]


class SourceMismatchError(UnsafeReferenceError, ModelMismatchError):
    """The file's instructions are not the ones the model's own source lowers to."""


_KIND = {JSONObject: dict, tuple: list}
_BODY_KEYS = {"prepare", "body", "else_body", "final_body"}
_INSTR_IGNORED = {"resolved", "location"}
_FUNCTION_IGNORED = {"file", "firstlineno", "source"}
_BLOCK_KEYS = ("name", "path", "module_type", "method_name", "wrapped")


def lower_model(model: nn.Module) -> ModelBlockSchema:
    """The model's schema lowered from its current source, without running anything."""
    return NNParser.parse_model(model, resolve=False)


class _Difference(Exception):
    def __init__(self, where: str, what: str, location: Optional[str]):
        super().__init__(where)
        self.where, self.what, self.location = where, what, location


def _same_value(a: Any, b: Any) -> bool:
    """JSON equality, where a global reference is the same whatever module name its file had."""
    kind = _KIND.get(type(a), type(a))  # the file's objects and arrays are compact, the model's dicts and lists
    if kind is not _KIND.get(type(b), type(b)):
        return False
    if kind is dict:
        if a.get("kind") == "global" and b.get("kind") == "global":
            keys = ("name", "type", "qualname")
            return all(a.get(k) == b.get(k) for k in keys) and set(a) == set(b)
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    if kind is list:
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    return a == b


def _globals_in(value: Any) -> set:
    """The qualified names of the global references inside a JSON value."""
    found: set = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if is_object(item):
            if item.get("kind") == "global":
                found.add(str(item.get("qualname")))
            stack.extend(item.values())
        elif is_array(item):
            stack.extend(item)
    return found


def _short(value: Any, limit: int = 100) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


class _Comparison:
    """Walks the file's document and the fresh lowering's document side by side."""

    def __init__(self, file_doc: dict, live_doc: dict):
        self.file_files = file_doc.get("files", [])
        self.live_files = live_doc.get("files", [])
        self.skips: list[tuple[str, Optional[str], str]] = []  # (path, method_name, reason) the file ran as modules

    def _location(self, instr: Optional[dict], files: list) -> Optional[str]:
        loc = instr.get("location") if is_object(instr) else None
        if not is_object(loc):
            return None
        index = loc.get("file")
        path = files[index]["path"] if type(index) is int and 0 <= index < len(files) else "?"
        code = f" `{loc.get('code')}`" if loc.get("code") else ""
        return f"{path}:{loc.get('line')}{code}"

    def block(self, mine: dict, live: dict, label: str) -> None:
        for key in _BLOCK_KEYS:
            if mine.get(key) != live.get(key):
                raise _Difference(label, f"{key} is {_short(mine.get(key))} in the file, {_short(live.get(key))} "
                                         "in the model", None)
        skipped_by_file = mine.get("skip_reason") is not None
        skipped_live = live.get("skip_reason") is not None
        if skipped_live and not skipped_by_file:
            raise _Difference(label, f"the file has a lowered body where the model's source runs as the real module "
                                     f"({live.get('skip_reason')})", None)
        if skipped_by_file and not skipped_live:
            self.skips.append((live["path"], live.get("method_name"), mine["skip_reason"]))
        if not (skipped_by_file or skipped_live):
            if not _same_value(mine.get("input_defaults"), live.get("input_defaults")):
                raise _Difference(label, "the forward's defaults differ", None)
            self.function(mine.get("signature"), live.get("signature"), label + ".signature")
            if ("body" in mine) != ("body" in live):
                raise _Difference(label, "the file's body is not the forward's body", None)
            if "body" in mine:
                self.body(mine["body"], live["body"], label + ".body")
            if ("methods" in mine) != ("methods" in live):
                raise _Difference(label, "the method table is not shared as in the model", None)
            if "methods" in mine:
                self.keys(mine["methods"], live["methods"], label + ".methods", "method")
                for key in mine["methods"]:
                    self.block(mine["methods"][key], live["methods"][key], f"{label}.methods[{key!r}]")
        if ("sub_blocks" in mine) != ("sub_blocks" in live):
            raise _Difference(label, "the sub-blocks are not shared as in the model", None)
        if "sub_blocks" in mine:
            self.keys(mine["sub_blocks"], live["sub_blocks"], label + ".sub_blocks", "sub-block")
            for key in mine["sub_blocks"]:
                self.block(mine["sub_blocks"][key], live["sub_blocks"][key], f"{label}.sub_blocks[{key!r}]")

    @staticmethod
    def keys(mine: dict, live: dict, label: str, what: str) -> None:
        if list(mine) != list(live):
            extra = [k for k in mine if k not in live]
            missing = [k for k in live if k not in mine]
            detail = (f"the file has the {what} {extra[0]!r}, the model's source does not" if extra else
                      f"the model's source has the {what} {missing[0]!r}, the file does not" if missing else
                      f"the {what}s are in another order")
            raise _Difference(label, detail, None)

    def function(self, mine: Any, live: Any, label: str) -> None:
        if (mine is None) != (live is None):
            raise _Difference(label, "only one of the file and the model's source has a function here", None)
        if mine is None:
            return
        for key in sorted(set(mine) | set(live)):
            if key in _FUNCTION_IGNORED:
                continue
            if key == "body":
                self.body(mine.get("body", []), live.get("body", []), label + ".body")
            elif not _same_value(mine.get(key), live.get(key)):
                raise _Difference(label, f"{key} is {_short(mine.get(key))} in the file, {_short(live.get(key))} "
                                         "in the model's source", None)

    def body(self, mine: list, live: list, label: str) -> None:
        for index in range(max(len(mine), len(live))):
            where = f"{label}[{index}]"
            if index >= len(live):
                raise _Difference(where, f"the file has an extra instruction (a {self.describe(mine[index])}) the "
                                         "model's source does not have", self._location(mine[index], self.file_files))
            if index >= len(mine):
                raise _Difference(where, f"the file lacks the model's {self.describe(live[index])}",
                                  self._location(live[index], self.live_files))
            self.instruction(mine[index], live[index], where)

    def instruction(self, mine: dict, live: dict, where: str) -> None:
        at = self._location(live, self.live_files)
        if mine.get("type") != live.get("type"):
            raise _Difference(where, f"the file has a {self.describe(mine)} where the model's source has a "
                                     f"{self.describe(live)}", at)
        for key in sorted(set(mine) | set(live)):
            if key in _INSTR_IGNORED:
                continue
            a, b = mine.get(key), live.get(key)
            if key in _BODY_KEYS and is_array(a) and is_array(b):
                self.body(a, b, f"{where}.{key}")
            elif key == "condition" and mine.get("type") == "control" and is_object(a) and is_object(b):
                self.instruction(a, b, f"{where}.condition")
            elif key == "handler_bodies" and is_array(a) and is_array(b) and len(a) == len(b):
                for i, (x, y) in enumerate(zip(a, b)):
                    self.body(x, y, f"{where}.handler_bodies[{i}]")
            elif key == "function" and mine.get("type") == "function":
                self.function(a, b, f"{where}.function")
            elif not _same_value(a, b):
                foreign = _globals_in(a) - _globals_in(b)
                note = (f"; the file names {sorted(foreign)[0]}, which is not referenced by the model's own code "
                        "there" if foreign else "")
                raise _Difference(where, f"the file's {self.describe(mine)} is not the model's "
                                         f"{self.describe(live)}: its {key} is {_short(a)} in the file, {_short(b)} "
                                         f"in the model's source{note}", at)

    @staticmethod
    def describe(instr: Any) -> str:
        if not is_object(instr):
            return "malformed instruction"
        kind = instr.get("type")
        if kind == "op":
            return f"call of {instr.get('display_name') or instr.get('qualified_name')!r}"
        if kind == "control":
            return f"{instr.get('kind')!r} statement"
        return f"{kind!r} instruction"


def _instruction_bodies(instr: Instruction) -> list[list[Instruction]]:
    if isinstance(instr, ControlInstruction):
        return [instr.prepare, instr.body, instr.else_body]  # its condition: _copy_resolved
    if isinstance(instr, TryInstruction):
        return [instr.body, *instr.handler_bodies, instr.else_body, instr.final_body]
    if isinstance(instr, WithInstruction):
        return [instr.body]
    if isinstance(instr, FunctionInstruction) and instr.function is not None:
        return [instr.function.body]
    return []


def _copy_resolved(mine: list[Instruction], live: list[Instruction], seen: set) -> None:
    if id(live) in seen:
        return
    seen.add(id(live))
    for a, b in zip(mine, live):
        b.resolved = a.resolved
        if isinstance(a, ControlInstruction) and isinstance(b, ControlInstruction):
            b.condition.resolved = a.condition.resolved
        for x, y in zip(_instruction_bodies(a), _instruction_bodies(b)):
            _copy_resolved(x, y, seen)


def _blocks(root: ModelBlockSchema) -> dict[tuple[str, Optional[str]], ModelBlockSchema]:
    return {(block.path, block.method_name): block for block in root.iter_blocks()}


def verified_schema(document: dict, decoded: ModelBlockSchema, fresh: ModelBlockSchema,
                    source: str) -> ModelBlockSchema:
    """`fresh` (the model's own lowering) carrying the file's viewer data, once the file equals it.

    Raises SourceMismatchError naming the first instruction of the file that the model's source
    does not have; nothing of the model or of `fresh` is changed then.
    """
    try:
        expected = SchemaEncoder().document(fresh)
    except SchemaFormatError as exc:
        raise ModelMismatchError(f"{source}: the model's own schema cannot be written as a file ({exc}), so no "
                                 "file can describe it") from None
    comparison = _Comparison(document, expected)
    try:
        comparison.block(document["root"], expected["root"], "root")
    except _Difference as diff:
        at = f" at {diff.location}" if diff.location else ""
        raise SourceMismatchError(
            f"{source}: {diff.where}{at}: {diff.what}. A schema file may run only the instructions the model's own "
            "source lowers to; re-save the schema from this model with save_schema(NNParser.parse_model(model, ...), path)") from None
    live_blocks = _blocks(fresh)
    for path, method_name, reason in comparison.skips:
        block = live_blocks[(path, method_name)]
        methods = block.methods
        _BlockBuilder.skip(block, reason)
        if method_name is not None:
            block.methods = methods  # a method block keeps sharing its owner's table
    mine_blocks = _blocks(decoded)
    seen: set = set()
    for key, block in _blocks(fresh).items():
        twin = mine_blocks.get(key)
        if twin is None:
            continue
        block.inputs = dict(twin.inputs)
        block.outputs = list(twin.outputs)
        # live code reached it on the parse run: runs lend it its schema (only ever the model's own)
        block.reached_live = block.reached_live or twin.reached_live
        if block.skip_reason is None and twin.skip_reason is None:
            _copy_resolved(twin.body, block.body, seen)
    _collect_skipped(fresh)
    return fresh
