"""A schema tree as a JSON document and back: blocks, functions and instructions (docs/FORMAT.md).

`SchemaEncoder.document(root)` turns a ModelBlockSchema into plain JSON data: weights are described
(shape, dtype) but never written, `resolved` keeps shape and dtype only, live modules and decorator
wrappers are left out. `SchemaDecoder.document(data)` checks every record field by field and rebuilds
the tree; callables come from the allowlist, objects of the model's code from a `Resolver`, attribute
names are checked, and getattr with a computed name is swapped for its checked twin.

The decoder charges every object it builds to the file's memory budget (file_format.DecodeBudget).

Longer than 600 lines because it is the encoder and the decoder of one format, one method per
instruction type each way, kept side by side so that a field cannot be written and not read.

Pure data transformation: no file IO, no model. Depends on schema, lowering.intrinsics (the target
of a named test), value_codec, allowlist, file_format and errors.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Optional

from .allowlist import ATTRIBUTE_ACCESSORS, attribute_problem, check_attribute, resolve_callable
from ..schema.errors import SchemaFormatError
from .file_format import (
    DecodeBudget,
    FileLimits,
    JSONObject,
    decode_budget,
    MalformedFileError,
    UnsafeReferenceError,
    get_bool,
    get_dict,
    get_int,
    get_list,
    get_opt_str,
    get_str,
    get_str_dict,
    get_str_list,
    is_array,
    is_object,
    field_names,
    object_bytes,
    record,
)
from ..lowering import intrinsics
from ..schema.model import (
    TEST_STYLE,
    BlockInstruction,
    BlockRef,
    BreakInstruction,
    Const,
    ContinueInstruction,
    ControlInstruction,
    DeleteInstruction,
    YieldInstruction,
    FunctionInstruction,
    FunctionSchema,
    Instruction,
    ModelBlockSchema,
    OpInstruction,
    RaiseInstruction,
    ReturnInstruction,
    SourceLocation,
    TensorRepr,
    TensorReprWithValue,
    TryInstruction,
    VarRef,
    WithInstruction,
    is_named_test,
)
from .value_codec import Resolver, UnresolvedReference, ValueDecoder, ValueEncoder, module_for_file

__all__ = ["SchemaEncoder", "SchemaDecoder", "FORMAT_NAME", "FORMAT_VERSION", "OLD_VERSIONS", "OLD_VERSION_FIX",
           "repr_to_json", "repr_from_json"]

FORMAT_NAME = "nnschemaparser-schema"
FORMAT_VERSION = 2
# What each older version wrote differently, for the refusal naming it (file_format.check_header).
OLD_VERSIONS = {
    1: "it keeps a ControlInstruction's condition as a list of instructions; version 2 keeps them as "
       "\"prepare\" (a list) and \"condition\" (one op instruction binding cond_var)",
}
OLD_VERSION_FIX = "re-parse the model with NNParser.parse_model and save it again with save_schema"

_TYPES = {
    OpInstruction: "op", BlockInstruction: "block", ControlInstruction: "control", TryInstruction: "try",
    WithInstruction: "with", FunctionInstruction: "function", RaiseInstruction: "raise",
    DeleteInstruction: "delete", YieldInstruction: "yield", ReturnInstruction: "return", ContinueInstruction: "continue",
    BreakInstruction: "break",
}
_COMMON = ("type", "out_var", "resolved", "location")
_FIELDS = {
    "op": ("target", "qualified_name", "display_name", "args", "kwargs", "args_var", "kwargs_var", "star_args",
           "mutates", "style"),
    "block": ("block_ref", "args", "kwargs", "splat_args", "callee_var", "args_var", "kwargs_var", "star_args"),
    "control": ("kind", "prepare", "condition", "cond_var", "body", "else_body", "bind_var", "iter_container",
                "index_var"),
    "try": ("body", "handlers", "handler_names", "handler_bodies", "else_body", "final_body"),
    "with": ("context_var", "bind_var", "body"),
    "function": ("function", "defaults", "kw_defaults"),
    "raise": ("exc", "cause", "has_cause"),
    "delete": ("names",),
    "yield": ("value",),
    "return": ("out_vars", "as_tuple"),
    "continue": (),
    "break": (),
}
_BLOCK_FIELDS = ("name", "path", "module_type", "method_name", "skip_reason", "wrapped", "inputs", "outputs",
                 "weights", "input_defaults", "skipped", "signature")
_FUNCTION_FIELDS = ("name", "params", "vararg", "kwonly", "kwarg", "defaults", "body", "file", "firstlineno",
                    "source", "free_vars", "nonlocal_vars", "weight_refs", "self_name")
_METHOD_KEY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*|<locals>)(\.([A-Za-z_][A-Za-z0-9_]*|<locals>))*\Z")
_MAX_DIM = 2 ** 62


def repr_to_json(rep: Optional[TensorRepr], where: str = "a value") -> Optional[dict]:
    """{"shape": [...], "dtype": "..."}: the description only, never the value."""
    if rep is None:
        return None
    try:
        shape = [int(d) for d in rep.shape]
    except (TypeError, ValueError):
        raise SchemaFormatError(f"cannot save {where}: its shape {rep.shape!r} is not a tuple of ints") from None
    return {"shape": shape, "dtype": str(rep.dtype)}


def repr_from_json(data: Any, where: str, limits: FileLimits) -> Optional[TensorRepr]:
    if data is None:
        return None
    record(data, where, ("shape", "dtype"))
    shape = get_list(data, "shape", where)
    if len(shape) > limits.max_dims:
        raise MalformedFileError(f"{where}.shape: {len(shape)} dimensions, more than the limit of {limits.max_dims}")
    for index, dim in enumerate(shape):
        if type(dim) is not int or not 0 <= dim < _MAX_DIM:
            raise MalformedFileError(f"{where}.shape[{index}]: a dimension is a non-negative integer, got {dim!r}")
    return TensorRepr(shape=tuple(shape), dtype=get_str(data, "dtype", where, max_chars=256))


# --- encoding ---------------------------------------------------------------------------------


class SchemaEncoder:
    """Schema tree -> JSON data. `collect` records the global references (see ValueEncoder)."""

    def __init__(self, collect: Optional[dict] = None, max_depth: int = 64):
        self.values = ValueEncoder(max_depth=max_depth, collect=collect)
        self.files: list[dict] = []
        self._file_index: dict[str, int] = {}

    def document(self, root: ModelBlockSchema) -> dict:
        if not isinstance(root, ModelBlockSchema):
            raise SchemaFormatError(f"save_schema needs a ModelBlockSchema (from NNParser.parse_model), "
                                    f"got {type(root).__name__}")
        body = self.block(root, None)
        return {"format": FORMAT_NAME, "version": FORMAT_VERSION, "files": self.files, "root": body}

    def file(self, filename: str) -> Optional[int]:
        if not filename:
            return None
        index = self._file_index.get(filename)
        if index is None:
            index = self._file_index[filename] = len(self.files)
            self.files.append({"path": filename, "module": module_for_file(filename)})
        return index

    def _enter(self, filename: str, fallback: str = "") -> str:
        saved = self.values.namespace
        self.values.namespace = module_for_file(filename) or fallback
        return saved

    def block(self, block: ModelBlockSchema, owner: Optional[ModelBlockSchema]) -> dict:
        sig = block.signature
        saved = self._enter(sig.filename if sig is not None else "", block.module_type.rpartition(".")[0])
        where = f"block {block.path or block.name!r}"
        try:
            data = {
                "name": block.name, "path": block.path, "module_type": block.module_type,
                "method_name": block.method_name, "skip_reason": block.skip_reason,
                "wrapped": block.wrapper is not None,
                "inputs": {name: repr_to_json(rep, f"{where} input {name!r}") for name, rep in block.inputs.items()},
                "outputs": [repr_to_json(rep, f"{where} output") for rep in block.outputs],
                "weights": {name: repr_to_json(rep, f"{where} weight {name!r}") for name, rep in block.weights.items()},
                "input_defaults": {name: self.values.value(value, f"default:{block.name}.{name}")
                                   for name, value in block.input_defaults.items()},
                "skipped": dict(block.skipped),
                "signature": self.function(sig) if sig is not None else None,
            }
            if block.reached_live:
                data["reached_live"] = True  # runs lend it the schema as its forward (runtime/lending.py)
            if block.self_attr is not None:
                data["self_attr"] = block.self_attr  # a plain object's __call__: `self` is this attribute
            if sig is None or block.body is not sig.body:
                data["body"] = self.body(block.body)
            if owner is None or block.methods is not owner.methods:
                data["methods"] = {key: self.block(method, block) for key, method in block.methods.items()}
            if owner is None or block.sub_blocks is not owner.sub_blocks:
                data["sub_blocks"] = {key: self.block(child, None) for key, child in block.sub_blocks.items()}
        finally:
            self.values.namespace = saved
        return data

    def function(self, fn: FunctionSchema) -> dict:
        saved = self._enter(fn.filename, self.values.namespace)
        try:
            return {
                "name": fn.name, "params": list(fn.params), "vararg": fn.vararg, "kwonly": list(fn.kwonly),
                "kwarg": fn.kwarg,
                "defaults": {name: self.values.value(value, f"default:{fn.name}.{name}")
                             for name, value in fn.defaults.items()},
                "body": self.body(fn.body), "file": self.file(fn.filename), "firstlineno": fn.firstlineno,
                "source": fn.source, "free_vars": list(fn.free_vars), "nonlocal_vars": list(fn.nonlocal_vars),
                "weight_refs": dict(fn.weight_refs), "self_name": fn.self_name,
            }
        finally:
            self.values.namespace = saved

    def body(self, instrs: list[Instruction]) -> list[dict]:
        return [self.instruction(instr) for instr in instrs]

    def instruction(self, instr: Instruction) -> dict:
        kind = _TYPES.get(type(instr))
        if kind is None:
            raise SchemaFormatError(f"cannot save an instruction of type {type(instr).__name__}; the format knows "
                                    f"{', '.join(t.__name__ for t in _TYPES)}")
        loc = instr.location
        data: dict[str, Any] = {
            "type": kind, "out_var": instr.out_var, "resolved": repr_to_json(instr.resolved, instr.out_var),
            "location": None if loc is None else {"file": self.file(loc.filename), "line": loc.lineno,
                                                  "code": loc.code},
        }
        if loc is not None and loc.end_lineno:
            data["location"]["cols"] = [loc.col, loc.end_lineno, loc.end_col]
        getattr(self, "encode_" + kind)(instr, data)
        return data

    def _operands(self, instr: Any, data: dict, site: str) -> None:
        data["args"] = [self.values.operand(arg, site) for arg in instr.args]
        data["kwargs"] = {key: self.values.operand(arg, site) for key, arg in instr.kwargs.items()}
        data["args_var"] = instr.args_var
        data["kwargs_var"] = instr.kwargs_var
        data["star_args"] = list(instr.star_args)

    def encode_op(self, instr: OpInstruction, data: dict) -> None:
        site = instr.display_name or instr.qualified_name
        target = instr.target
        data["target"] = ({"kind": "var", "name": target.name} if isinstance(target, VarRef)
                          else self.values.value(target, site))
        data["qualified_name"] = instr.qualified_name
        data["display_name"] = instr.display_name
        self._operands(instr, data, site)
        data["mutates"] = instr.mutates
        data["style"] = instr.style

    def encode_block(self, instr: BlockInstruction, data: dict) -> None:
        ref = instr.block_ref
        data["block_ref"] = {"path": ref.path, "index_var": ref.index_var, "method": ref.method}
        self._operands(instr, data, "")
        data["splat_args"] = instr.splat_args
        data["callee_var"] = instr.callee_var

    def encode_control(self, instr: ControlInstruction, data: dict) -> None:
        data.update(kind=instr.kind, prepare=self.body(instr.prepare), condition=self.instruction(instr.condition),
                    cond_var=instr.cond_var, body=self.body(instr.body), else_body=self.body(instr.else_body),
                    bind_var=instr.bind_var, iter_container=instr.iter_container, index_var=instr.index_var)

    def encode_try(self, instr: TryInstruction, data: dict) -> None:
        handlers = []
        for classes in instr.handlers:
            handlers.append([self.values.value(cls, "except:" + _class_name(cls)) for cls in classes])
        data.update(body=self.body(instr.body), handlers=handlers, handler_names=list(instr.handler_names),
                    handler_bodies=[self.body(b) for b in instr.handler_bodies], else_body=self.body(instr.else_body),
                    final_body=self.body(instr.final_body))

    def encode_with(self, instr: WithInstruction, data: dict) -> None:
        data.update(context_var=instr.context_var, bind_var=instr.bind_var, body=self.body(instr.body))

    def encode_function(self, instr: FunctionInstruction, data: dict) -> None:
        if instr.function is None:
            raise SchemaFormatError(f"cannot save FunctionInstruction {instr.out_var!r}: it has no function")
        data["function"] = self.function(instr.function)
        data["defaults"] = [self.values.operand(d, f"default:{instr.out_var}") for d in instr.defaults]
        data["kw_defaults"] = {k: self.values.operand(v, f"default:{instr.out_var}.{k}")
                               for k, v in instr.kw_defaults.items()}

    def encode_raise(self, instr: RaiseInstruction, data: dict) -> None:
        data["exc"] = None if instr.exc is None else self.values.operand(instr.exc, "raise")
        data["cause"] = None if instr.cause is None else self.values.operand(instr.cause, "raise")
        data["has_cause"] = instr.has_cause

    def encode_delete(self, instr: DeleteInstruction, data: dict) -> None:
        data["names"] = list(instr.names)

    def encode_yield(self, instr: YieldInstruction, data: dict) -> None:
        data["value"] = None if instr.value is None else self.values.operand(instr.value, "yield")

    def encode_return(self, instr: ReturnInstruction, data: dict) -> None:
        data["out_vars"] = list(instr.out_vars)
        data["as_tuple"] = instr.as_tuple

    def encode_continue(self, instr: ContinueInstruction, data: dict) -> None:
        pass

    encode_break = encode_continue


def _class_name(cls: Any) -> str:
    return f"{getattr(cls, '__module__', '')}.{getattr(cls, '__qualname__', type(cls).__name__)}"


# --- decoding ---------------------------------------------------------------------------------


class SchemaDecoder:
    """JSON data -> schema tree, checking every field; `source` names the file in every error."""

    def __init__(self, resolver: Resolver, limits: FileLimits, source: str, budget: Optional[DecodeBudget] = None):
        # What the schema's objects take is charged to the file's budget as they are built (the
        # budget of load_schema: the file's memory bound); without one, to max_decoded_bytes.
        self.budget = budget if budget is not None else decode_budget(0, limits, source, unbounded=True)
        self.charge = self.budget.charge
        self.values = ValueDecoder(resolver, limits.max_depth, self.budget)
        self.charge(DECODER_BYTES, "the decoder")  # its own state while it runs: names of entries, memo tables
        self.limits = limits
        self.source = source
        self.files: list[tuple[str, str]] = []
        self.paths: set[str] = set()
        # A file's identical shape records are one object (bounded_json shares equal containers):
        # they decode to one TensorRepr, as an identical record of the same file means the same thing.
        self._reprs: dict[JSONObject, Optional[TensorRepr]] = {}

    def repr(self, data: Any, where: str) -> Optional[TensorRepr]:
        """repr_from_json, once per distinct record (equal records of one file are one JSONObject)."""
        if type(data) is not JSONObject:  # a plain dict (a document not read by load_schema): no sharing
            return repr_from_json(data, where, self.limits)
        known = self._reprs.get(data)
        if known is None:
            known = self._reprs[data] = repr_from_json(data, where, self.limits)
            self.charge(_charged(known) + _ENTRY_BYTES, "a shape")
        return known

    def document(self, data: dict) -> ModelBlockSchema:
        record(data, self.source, ("format", "version", "files", "root"))
        for index, entry in enumerate(get_list(data, "files", self.source)):
            where = f"{self.source}: files[{index}]"
            record(entry, where, ("path", "module"))
            self.files.append((get_str(entry, "path", where), get_str(entry, "module", where)))
        root = self.block(data["root"], "root", None, "")
        self.budget.release(DECODER_BYTES)
        return root

    # -- blocks and functions ---------------------------------------------------------------

    def block(self, data: Any, where: str, owner: Optional[ModelBlockSchema], expected_path: str) -> ModelBlockSchema:
        at = f"{self.source}: {where}"
        record(data, at, _BLOCK_FIELDS, ("body", "sub_blocks", "methods", "reached_live", "self_attr"))
        path = get_str(data, "path", at)
        if path != expected_path:
            raise MalformedFileError(f"{at}.path: {path!r} does not match its place in the tree ({expected_path!r})")
        block = ModelBlockSchema(name=get_str(data, "name", at), path=path,
                                 module_type=get_str(data, "module_type", at),
                                 method_name=get_opt_str(data, "method_name", at),
                                 skip_reason=get_opt_str(data, "skip_reason", at))
        if (owner is None) != (block.method_name is None):
            raise MalformedFileError(f"{at}.method_name: a block under \"methods\" has a method name, others do not")
        if owner is None:
            if path in self.paths:
                raise MalformedFileError(f"{at}: a second block at path {path!r}")
            self.paths.add(path)
        if get_bool(data, "wrapped", at):
            # The decorator is the model's code: a placeholder until load_schema(..., model=...) binds it.
            label = f"{block.module_type}.{block.method_name or 'forward'}"
            block.wrapper = UnresolvedReference("", label, "function", f"decorator of {label}")
        block.inputs = {name: self.repr(rep, f"{at}.inputs[{name!r}]")
                        for name, rep in get_dict(data, "inputs", at).items()}
        block.outputs = [self.repr(rep, f"{at}.outputs[{i}]")
                         for i, rep in enumerate(get_list(data, "outputs", at))]
        block.weights = {}
        for name, rep in get_dict(data, "weights", at).items():
            rep = repr_from_json(rep, f"{at}.weights[{name!r}]", self.limits)
            if rep is None:
                raise MalformedFileError(f"{at}.weights[{name!r}]: a weight is described by its shape and dtype")
            block.weights[name] = TensorReprWithValue(shape=rep.shape, dtype=rep.dtype)  # the value is the model's
            self.charge(_charged(block.weights[name]), "a weight")
        block.input_defaults = {name: self.values.value(value, f"{at}.input_defaults[{name!r}]")
                                for name, value in get_dict(data, "input_defaults", at).items()}
        block.skipped = get_str_dict(data, "skipped", at)
        block.reached_live = get_bool(data, "reached_live", at) if "reached_live" in data else False
        block.self_attr = get_opt_str(data, "self_attr", at) if "self_attr" in data else None
        self.charge(_charged(block), "a block")
        if data["signature"] is not None:
            block.signature = self.function(data["signature"], f"{where}.signature")
        if "body" in data:
            block.body = self.body(get_list(data, "body", at), f"{where}.body")
        elif block.signature is not None:
            block.body = block.signature.body
        if "sub_blocks" in data:
            for key, child in get_dict(data, "sub_blocks", at).items():
                if not key or any(not part or part.startswith("__") for part in key.split(".")):
                    raise MalformedFileError(f"{at}.sub_blocks: {key!r} is not an attribute path")
                child_path = f"{path}.{key}" if path else key
                block.sub_blocks[key] = self.block(child, f"{where}.sub_blocks[{key!r}]", None, child_path)
        elif owner is not None:
            block.sub_blocks = owner.sub_blocks  # a method block shares its owner's children
        else:
            raise MalformedFileError(f"{at}: missing field 'sub_blocks'")
        if "methods" not in data:
            if owner is None:
                raise MalformedFileError(f"{at}: missing field 'methods'")
            block.methods = owner.methods  # method blocks share their owner's method table
            return block
        if owner is not None:
            raise MalformedFileError(f"{at}.methods: a method block shares its owner's methods and lists none")
        for key, method in get_dict(data, "methods", at).items():
            self._method_key(key, f"{at}.methods")
            block.methods[key] = self.block(method, f"{where}.methods[{key!r}]", block, path)
            if block.methods[key].method_name != key:
                raise MalformedFileError(f"{at}.methods[{key!r}]: its method_name does not match the key")
        return block

    @staticmethod
    def _method_key(key: str, where: str) -> None:
        if not _METHOD_KEY.match(key):
            raise MalformedFileError(f"{where}: {key[:60]!r} is not a method name")
        for part in key.split("."):
            if part != "<locals>":
                check_attribute(part, where, write=True)  # a method is called: no dunder at all

    def function(self, data: Any, where: str) -> FunctionSchema:
        at = f"{self.source}: {where}"
        record(data, at, _FUNCTION_FIELDS)
        fn = FunctionSchema(name=get_str(data, "name", at), params=get_str_list(data, "params", at),
                            vararg=get_opt_str(data, "vararg", at), kwonly=get_str_list(data, "kwonly", at),
                            kwarg=get_opt_str(data, "kwarg", at), source=get_str(data, "source", at),
                            firstlineno=get_int(data, "firstlineno", at),
                            free_vars=tuple(get_str_list(data, "free_vars", at)),
                            nonlocal_vars=tuple(get_str_list(data, "nonlocal_vars", at)),
                            self_name=get_opt_str(data, "self_name", at))
        fn.filename = self._file(data["file"], f"{at}.file")
        fn.defaults = {name: self.values.value(value, f"{at}.defaults[{name!r}]")
                       for name, value in get_dict(data, "defaults", at).items()}
        fn.weight_refs = get_str_dict(data, "weight_refs", at)
        for attr in fn.weight_refs.values():
            check_attribute(attr, f"{at}.weight_refs")
        self.charge(_charged(fn), "a function")
        fn.body = self.body(get_list(data, "body", at), f"{where}.body")
        return fn

    def _file(self, index: Any, where: str) -> str:
        if index is None:
            return ""
        if type(index) is not int or not 0 <= index < len(self.files):
            raise MalformedFileError(f"{where}: {index!r} is not an index into \"files\" (0..{len(self.files) - 1})")
        return self.files[index][0]

    # -- instructions -----------------------------------------------------------------------

    def body(self, items: list, where: str) -> list[Instruction]:
        self.charge(_LIST_BYTES + _ITEM_BYTES * len(items), "a body")
        instrs = [self.instruction(item, f"{where}[{i}]") for i, item in enumerate(items)]
        for i, instr in enumerate(instrs):
            if isinstance(instr, OpInstruction) and is_named_test(instr):
                raise MalformedFileError(f"{self.source}: {where}[{i}].style: {TEST_STYLE!r} marks a control "
                                         "instruction's condition that runs nothing; an instruction list has none")
        return instrs

    def instruction(self, data: Any, where: str) -> Instruction:
        at = f"{self.source}: {where}"
        if not is_object(data):
            raise MalformedFileError(f"{at}: expected an instruction object")
        kind = data.get("type")
        if type(kind) is not str or kind not in _FIELDS:
            raise MalformedFileError(f"{at}.type: unknown instruction type {kind!r}; known: {', '.join(_FIELDS)}")
        record(data, at, _COMMON + _FIELDS[kind])
        instr = getattr(self, "decode_" + kind)(data, at, where)
        instr.out_var = get_str(data, "out_var", at)
        instr.resolved = self.repr(data["resolved"], f"{at}.resolved")
        loc = data["location"]
        if loc is not None:
            record(loc, f"{at}.location", ("file", "line", "code"), ("cols",))
            cols = [0, 0, 0]
            if "cols" in loc:
                cols = get_list(loc, "cols", f"{at}.location")
                if len(cols) != 3:
                    raise MalformedFileError(f"{at}.location.cols: expected [col, end_line, end_col], got "
                                             f"{len(cols)} items")
                box = dict(zip(("col", "end_line", "end_col"), cols))
                cols = [get_int(box, key, f"{at}.location.cols") for key in ("col", "end_line", "end_col")]
            instr.location = SourceLocation(self._file(loc["file"], f"{at}.location.file"),
                                            get_int(loc, "line", f"{at}.location"), get_str(loc, "code", f"{at}.location"),
                                            *cols)
            self.charge(object_bytes(instr.location), "a location")
        self.charge(_charged(instr), "an instruction")
        return instr

    def _operands(self, data: dict, at: str) -> dict:
        args = [self.values.operand(arg, f"{at}.args[{i}]") for i, arg in enumerate(get_list(data, "args", at))]
        kwargs = {key: self.values.operand(arg, f"{at}.kwargs[{key!r}]")
                  for key, arg in get_dict(data, "kwargs", at).items()}
        stars = get_list(data, "star_args", at)
        if any(type(s) is not int or not 0 <= s < len(args) for s in stars) or len(set(stars)) != len(stars):
            raise MalformedFileError(f"{at}.star_args: positions must be distinct indexes into args")
        return dict(args=args, kwargs=kwargs, star_args=tuple(stars), args_var=get_opt_str(data, "args_var", at),
                    kwargs_var=get_opt_str(data, "kwargs_var", at))

    def decode_op(self, data: dict, at: str, where: str) -> OpInstruction:
        raw = data["target"]
        if is_object(raw) and raw.get("kind") == "var":
            target: Any = self.values.operand(raw, f"{at}.target")
        else:
            target = self._target(raw, f"{at}.target")
        fields = self._operands(data, at)
        instr = OpInstruction(target=target, qualified_name=get_str(data, "qualified_name", at),
                              display_name=get_str(data, "display_name", at), mutates=get_bool(data, "mutates", at),
                              style=get_str(data, "style", at), **fields)
        guard = ATTRIBUTE_ACCESSORS.get(target) if isinstance(target, type(len)) else None
        if guard is not None:
            name = instr.args[1] if len(instr.args) > 1 and not instr.star_args else None
            if isinstance(name, Const):
                name = name.value
            if type(name) is str:
                check_attribute(name, f"{at}.args[1]", write=guard[1])
            else:
                instr.target = guard[0]  # a computed name: checked when the instruction runs
        return instr

    def _target(self, raw: Any, where: str) -> Any:
        if not is_object(raw) or raw.get("kind") not in ("callable", "global"):
            raise MalformedFileError(f"{where}: a call target is a variable, an allowlisted callable or a global "
                                     "of the model's code")
        if raw.get("kind") == "callable":
            record(raw, where, ("kind", "name"))
            return resolve_callable(raw["name"], where)  # the raw builtin: its name is checked above
        return self.values.value(raw, where)

    def decode_block(self, data: dict, at: str, where: str) -> BlockInstruction:
        ref = data["block_ref"]
        record(ref, f"{at}.block_ref", ("path", "index_var", "method"))
        path = get_str(ref, "path", f"{at}.block_ref")
        for part in path.split(".") if path else ():
            problem = _path_part_problem(part)
            if problem:
                raise UnsafeReferenceError(f"{at}.block_ref.path: {problem}; the file is refused")
        method = get_opt_str(ref, "method", f"{at}.block_ref")
        callee = get_opt_str(data, "callee_var", at)
        if method is not None:
            if callee is not None:
                check_attribute(method, f"{at}.block_ref.method", write=True)
            else:
                self._method_key(method, f"{at}.block_ref.method")
        return BlockInstruction(block_ref=BlockRef(path, get_opt_str(ref, "index_var", f"{at}.block_ref"), method),
                                splat_args=get_bool(data, "splat_args", at), callee_var=callee,
                                **self._operands(data, at))

    def decode_control(self, data: dict, at: str, where: str) -> ControlInstruction:
        kind = get_str(data, "kind", at)
        if kind not in ("if", "for", "while"):
            raise MalformedFileError(f"{at}.kind: {kind!r} is not 'if', 'for' or 'while'")
        cond_var = get_str(data, "cond_var", at)
        prepare = self.body(get_list(data, "prepare", at), f"{where}.prepare")
        raw = data["condition"]
        if not is_object(raw) or raw.get("type") != "op":
            raise MalformedFileError(f"{at}.condition: a control instruction's condition is one op instruction "
                                     "(the instructions before it are its \"prepare\" list)")
        condition = self.instruction(raw, f"{where}.condition")
        if condition.out_var != cond_var:
            raise MalformedFileError(f"{at}.condition.out_var: the condition binds {condition.out_var[:60]!r}, not "
                                     f"the cond_var {cond_var[:60]!r} it tests")
        if is_named_test(condition) and not (
                condition.target is intrinsics.assign and condition.args == [VarRef(cond_var)]
                and not (condition.kwargs or condition.star_args or condition.args_var or condition.kwargs_var
                         or condition.mutates)):
            raise MalformedFileError(f"{at}.condition: a condition of style {TEST_STYLE!r} names cond_var and runs "
                                     "nothing: it is cond_var = nnschemaparser.intrinsics.assign(cond_var), with no "
                                     "other argument")
        return ControlInstruction(
            kind=kind, prepare=prepare, condition=condition, cond_var=cond_var,
            body=self.body(get_list(data, "body", at), f"{where}.body"),
            else_body=self.body(get_list(data, "else_body", at), f"{where}.else_body"),
            bind_var=get_opt_str(data, "bind_var", at), iter_container=get_opt_str(data, "iter_container", at),
            index_var=get_opt_str(data, "index_var", at))

    def decode_try(self, data: dict, at: str, where: str) -> TryInstruction:
        handlers = []
        for i, classes in enumerate(get_list(data, "handlers", at)):
            if not is_array(classes):
                raise MalformedFileError(f"{at}.handlers[{i}]: expected an array of exception classes")
            decoded = []
            for j, raw in enumerate(classes):
                cls = self.values.value(raw, f"{at}.handlers[{i}][{j}]")
                ok = isinstance(cls, type) and issubclass(cls, BaseException)
                if not ok and not (isinstance(cls, UnresolvedReference) and cls.kind == "class"):
                    raise UnsafeReferenceError(f"{at}.handlers[{i}][{j}]: an except clause names exception classes "
                                               f"only, got {type(cls).__name__}")
                decoded.append(cls)
            handlers.append(tuple(decoded))
        names = get_list(data, "handler_names", at)
        bodies = [self.body(b if is_array(b) else _not_list(f"{at}.handler_bodies[{i}]"),
                            f"{where}.handler_bodies[{i}]") for i, b in enumerate(get_list(data, "handler_bodies", at))]
        if not (len(handlers) == len(names) == len(bodies)):
            raise MalformedFileError(f"{at}: handlers, handler_names and handler_bodies differ in length")
        if any(n is not None and type(n) is not str for n in names):
            raise MalformedFileError(f"{at}.handler_names: each is a string or null")
        return TryInstruction(body=self.body(get_list(data, "body", at), f"{where}.body"), handlers=handlers,
                              handler_names=list(names), handler_bodies=bodies,
                              else_body=self.body(get_list(data, "else_body", at), f"{where}.else_body"),
                              final_body=self.body(get_list(data, "final_body", at), f"{where}.final_body"))

    def decode_with(self, data: dict, at: str, where: str) -> WithInstruction:
        return WithInstruction(context_var=get_str(data, "context_var", at), bind_var=get_opt_str(data, "bind_var", at),
                               body=self.body(get_list(data, "body", at), f"{where}.body"))

    def decode_function(self, data: dict, at: str, where: str) -> FunctionInstruction:
        fn = self.function(data["function"], f"{where}.function")
        defaults = [self.values.operand(d, f"{at}.defaults[{i}]") for i, d in enumerate(get_list(data, "defaults", at))]
        if len(defaults) > len(fn.params):
            raise MalformedFileError(f"{at}.defaults: more defaults than parameters")
        kw_defaults = {k: self.values.operand(v, f"{at}.kw_defaults[{k!r}]")
                       for k, v in get_dict(data, "kw_defaults", at).items()}
        return FunctionInstruction(function=fn, defaults=defaults, kw_defaults=kw_defaults)

    def decode_raise(self, data: dict, at: str, where: str) -> RaiseInstruction:
        exc = None if data["exc"] is None else self.values.operand(data["exc"], f"{at}.exc")
        cause = None if data["cause"] is None else self.values.operand(data["cause"], f"{at}.cause")
        return RaiseInstruction(exc=exc, cause=cause, has_cause=get_bool(data, "has_cause", at))

    def decode_delete(self, data: dict, at: str, where: str) -> DeleteInstruction:
        return DeleteInstruction(names=get_str_list(data, "names", at))

    def decode_yield(self, data: dict, at: str, where: str) -> YieldInstruction:
        return YieldInstruction(value=None if data["value"] is None else self.values.operand(data["value"], f"{at}.value"))

    def decode_return(self, data: dict, at: str, where: str) -> ReturnInstruction:
        return ReturnInstruction(out_vars=get_str_list(data, "out_vars", at), as_tuple=get_bool(data, "as_tuple", at))

    def decode_continue(self, data: dict, at: str, where: str) -> ContinueInstruction:
        return ContinueInstruction()

    def decode_break(self, data: dict, at: str, where: str) -> BreakInstruction:
        return BreakInstruction()


_LIST_BYTES, _ITEM_BYTES, _ENTRY_BYTES = 88, 9, 40
DECODER_BYTES = 8 * 1024


def _charged(obj: Any) -> int:
    """What a decoded schema object takes: itself, its attribute dict and the containers it holds.

    Charged just after it is built (one object at a time); what its containers hold is charged
    where it is built (instructions, values).
    """
    total = object_bytes(obj)
    for name in field_names(type(obj)):
        value = getattr(obj, name)
        kind = type(value)
        if kind is list or kind is dict or kind is tuple or kind is set:
            total += sys.getsizeof(value)
        elif kind is BlockRef:
            total += object_bytes(value)
    return total


def _not_list(where: str) -> list:
    raise MalformedFileError(f"{where}: expected an array of instructions")


def _path_part_problem(part: str) -> Optional[str]:
    """A sub-module name of an attribute path: any registered child name, but no dunder or refused name."""
    if not part or len(part) > 1024:
        return f"{part[:60]!r} is not a sub-module name"
    if part.lstrip("-").isdigit():
        return None
    if part.isidentifier():
        return attribute_problem(part, write=True)  # no dunder at all on a module path
    return None if not part.startswith("_") else f"{part[:60]!r} is not a sub-module name"
