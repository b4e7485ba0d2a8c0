"""The hostile-file corpus: malformed and malicious schema and trace files that loading must refuse.

`build_corpus(canary)` starts from valid files of `CanaryModel` (a schema, an activation trace and a
gradient trace) and derives from them, deterministically: mutations of every kind of record
(missing, unknown and mistyped fields), references to dangerous callables and globals, dangerous
attribute names, forbidden value kinds, non-finite numbers, duplicate keys, nesting and size bombs,
truncations, inconsistent trees, header lies in trace files (lengths, dtypes, shapes, byte ranges),
and hand-written attacks (exec/eval/os.system/subprocess payloads, pickles, torch.save archives).
Every payload that would run code aims at `canary`: if any of it ran, the canary file would exist.

The trace-file mutations live in hostile_traces.py. Each `Hostile` says how to load it (schema or trace, with or without the model, with which limits)
and which SchemaFormatError subclass must come out.
"""

from __future__ import annotations

import copy
import io
import json
import pickle
import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch import nn

from nnschemaparser import NNParser
from nnschemaparser.schema.errors import SchemaFormatError
from nnschemaparser.files.file_format import (
    FileLimitError,
    FileLimits,
    FormatVersionError,
    MalformedFileError,
    ModelMismatchError,
    UnsafeReferenceError,
)
from nnschemaparser.traces.record import capture_run
from nnschemaparser.files.schema_file import schema_to_json
from nnschemaparser.files.trace_file import save_trace

from tests.support.hostile_bombs import schema_bombs, trace_bombs
from tests.support.hostile_traces import trace_mutations

__all__ = ["Hostile", "CanaryModel", "touch_canary", "build_corpus", "base_files"]


def touch_canary(path: str) -> None:
    """What every payload of the corpus tries to reach: creating this file proves code ran."""
    Path(path).write_text("code from a hostile file ran")


def halve(x: torch.Tensor) -> torch.Tensor:
    return x * 0.5


class CanaryGate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        return torch.sigmoid(self.lin(x))


class CanaryModel(nn.Module):
    """Small, but its schema holds every instruction type and every kind of reference."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(6, 6), nn.Linear(6, 6)])
        self.gate = CanaryGate()
        self.scale = 2.0

    def mix(self, a, b):
        return a * self.scale + b

    def forward(self, x, steps: int = 2):
        h = x
        for layer in self.layers:
            h = torch.relu(layer(h))
        g = self.gate(h)
        out = [halve(t) for t in (h, g)]
        total = self.mix(out[0], out[1])
        try:
            if total.shape[-1] != 6:
                raise ValueError(f"bad width {total.shape}")
        except (ValueError, KeyError) as err:
            del err
        with torch.no_grad():
            peak = total.abs().amax()
        i = 0
        while i < steps:
            i += 1
            if i > 5:
                break
            total = total + getattr(torch, "tanh")(total) * 0.0
        return total, peak


@dataclass
class Hostile:
    name: str
    kind: str  # "schema" | "trace"
    data: bytes
    error: type = SchemaFormatError
    with_model: bool = False
    limits: Optional[FileLimits] = None
    notes: dict = field(default_factory=dict)


def _inputs() -> dict:
    return {"x": torch.linspace(-1.0, 1.0, 12).reshape(2, 6)}


def base_files() -> dict[str, bytes]:
    """The valid files every mutation starts from (fixed seed)."""
    from nnschemaparser.files.file_format import dump_json

    torch.manual_seed(0)
    model = CanaryModel().eval()
    schema = NNParser.parse_model(model, inputs_tensors_values=_inputs())
    files = {"schema": dump_json(schema_to_json(schema))}
    scope = {"x": _inputs()["x"].requires_grad_(True)}
    record = capture_run(block=schema, scope=scope, capture_grads=True)
    record.outputs[0].sum().backward()
    with tempfile.TemporaryDirectory() as folder:
        for label, trace in (("activation", record.trace), ("gradient", record.gradients)):
            files[label] = save_trace(trace, Path(folder) / f"{label}.safetensors").read_bytes()
    return files


def model_factory() -> nn.Module:
    torch.manual_seed(0)
    return CanaryModel().eval()


# --- walking documents ----------------------------------------------------------------------------


def _records(doc: Any, pred: Callable[[dict], bool]) -> list[dict]:
    found, stack = [], [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if pred(node):
                found.append(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def _instrs(doc: Any, kind: Optional[str] = None) -> list[dict]:
    return _records(doc, lambda d: isinstance(d.get("type"), str) and "out_var" in d
                    and (kind is None or d["type"] == kind))


def _blocks(doc: Any) -> list[dict]:
    return _records(doc, lambda d: "module_type" in d and "wrapped" in d)


def _functions(doc: Any) -> list[dict]:
    return _records(doc, lambda d: "params" in d and "firstlineno" in d)


def _ops_with(doc: Any, name: str) -> list[dict]:
    return [op for op in _instrs(doc, "op") if op["target"] == {"kind": "callable", "name": name}]


def _consts(doc: Any) -> list[dict]:
    return _records(doc, lambda d: d.get("kind") == "const")


def _dump(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


# --- schema mutations -----------------------------------------------------------------------------

_DANGEROUS_CALLABLES = [
    "os.system", "posix.system", "builtins.eval", "builtins.exec", "builtins.compile", "builtins.open",
    "builtins.__import__", "builtins.globals", "builtins.vars", "builtins.breakpoint", "builtins.input",
    "subprocess.Popen", "subprocess.check_output", "subprocess.run", "numpy.testing._private.utils.runstring",
    "torch.load", "torch.save", "torch.hub.load", "torch.from_file", "torch.jit.load", "torch.ops.aten.add",
    "torch.serialization.load", "pickle.loads", "importlib.import_module", "shutil.rmtree", "operator.attrgetter",
    "operator.methodcaller", "torch.Tensor.numpy", "torch.Tensor.storage", "types.FunctionType", "ctypes.CDLL",
    "code.interact", "runpy.run_path", "torch.manual_seed", "torch.set_default_device", "builtins.super",
    "tests.support.hostile_corpus.touch_canary", "hostile_corpus.touch_canary", "nnschemaparser.intrinsics._Spread",
    "nnschemaparser.files.file_format.write_atomic", "torch.sparse_coo_tensor", "torch.Tensor.set_", "", "torch.",
    "builtins.getattr ", "TORCH.ADD",
]
_DANGEROUS_GLOBALS = [
    "os.system", "posix.system", "subprocess.Popen", "builtins.eval", "builtins.exec", "builtins.open",
    "numpy.testing._private.utils.runstring", "torch.load", "torch.serialization.load", "torch.hub.load",
    "torch.jit.load", "pickle.loads", "importlib.import_module", "shutil.rmtree", "types.CodeType", "ctypes.CDLL",
    "code.interact", "runpy.run_path", "sys.exit", "marshal.loads", "socket.socket", "pathlib.Path.write_text",
    "numpy.load", "torch.utils.cpp_extension.load_inline", "transformers.dynamic_module_utils.get_class_from_dynamic_module",
    "io.open", "tempfile.mkstemp", "multiprocessing.Process",
]
_DANGEROUS_ATTRIBUTES = [
    "__globals__", "__subclasses__", "__init__", "__builtins__", "__code__", "__reduce__", "__reduce_ex__",
    "__dict__", "__getattribute__", "__import__", "f_globals", "tofile", "system", "save_pretrained",
    "from_pretrained", "storage", "mro", "gi_frame", "tb_frame", "load_state_dict", "__call__ ", "a.b", "1abc", "",
]
_FORBIDDEN_VALUES = [
    {"kind": "pickle", "data": "gASVIQAAAAAAAACMBXBvc2l4lIwGc3lzdGVtlJOUjAV0b3VjaJSFlFKULg=="},
    {"kind": "eval", "code": "__import__('os').system('touch CANARY')"},
    {"kind": "code", "co_code": "00"}, {"kind": "module", "name": "os"}, {"kind": "torch", "name": "load"},
    {"kind": "torch", "name": "from_file"}, {"kind": "torch", "name": "__builtins__"},
    {"kind": "device", "value": "cpu; import os"}, {"kind": "device", "value": "../../etc"},
    {"kind": "float", "value": "1e999"}, {"kind": "float", "value": "Infinity"}, {"kind": "bytes", "hex": "zz"},
    {"kind": "set", "items": [[1, 2]]}, {"kind": "dict", "items": [[[1], 2]]}, {"kind": "dict", "items": [[1, 2, 3]]},
    {"kind": "dict", "items": [[1, 2], [1, 3]]}, {"kind": "size", "items": [-1]}, {"kind": "size", "items": [1.5]},
    {"kind": "var", "name": "x"}, {"kind": "slice", "lower": None, "upper": None, "step": None},
    {"kind": "callable", "name": "builtins.eval"}, {"kind": "callable"}, {"kind": "tuple"},
    {"kind": "tuple", "items": {"a": 1}}, {"kind": "complex", "real": "x", "imag": 0}, {"kind": None},
    {"kind": "global", "namespace": "os", "name": "system", "type": "function", "qualname": "os.system"},
    {"kind": "global", "namespace": "x y", "name": "a", "type": "function", "qualname": "m.a"},
    {"kind": "global", "namespace": "m", "name": "a", "type": "lambda", "qualname": "m.a"},
    {"kind": "global", "namespace": "m", "name": "", "type": "function", "qualname": "m.a"},
]
_TYPED_FIELDS = {
    "out_var": 5, "qualified_name": ["x"], "display_name": 1.5, "style": None, "cond_var": 0, "context_var": [],
    "mutates": 1, "splat_args": "false", "as_tuple": 0, "has_cause": None, "args": "x", "kwargs": [],
    "star_args": {}, "body": {}, "else_body": "x", "condition": None, "prepare": {}, "final_body": 3, "handlers": {},
    "names": "abc", "out_vars": [1], "params": [None], "kwonly": "a", "free_vars": [3], "firstlineno": "1",
    "source": 3, "weight_refs": [], "defaults": "x", "name": None, "path": 0, "module_type": {}, "wrapped": "yes",
    "inputs": [], "outputs": {}, "weights": [], "skipped": {"a": 1}, "input_defaults": [], "signature": 3,
    "method_name": 7, "skip_reason": 1, "resolved": {}, "location": "here", "line": -1, "file": "0",
    "code": None, "handler_names": [1], "index_var": 3, "bind_var": True, "args_var": 1, "kwargs_var": [],
    "callee_var": 2, "kind": "exec", "target": "torch.add", "function": None, "kw_defaults": [],
}


class _Maker:
    """Collects corpus entries; each mutation works on a fresh deep copy of the base document."""

    def __init__(self, base: dict, canary: str, rng: random.Random):
        self.base = base
        self.canary = canary
        self.rng = rng
        self.entries: list[Hostile] = []

    def doc(self) -> dict:
        return copy.deepcopy(self.base)

    def add(self, name: str, data: Any, error: type = SchemaFormatError, **kwargs: Any) -> None:
        if not isinstance(data, bytes):
            data = _dump(data)
        self.entries.append(Hostile(f"schema-{name}", "schema", data, error, **kwargs))

    def pick(self, items: list) -> Any:
        return self.rng.choice(items) if items else None


def _schema_mutations(m: _Maker) -> None:
    # 1. format and version
    for index, version in enumerate([0, 1, 3, 999, -1]):  # 1: the old shape of conditions
        doc = m.doc()
        doc["version"] = version
        m.add(f"version-{index}", doc, FormatVersionError)
    for index, version in enumerate(["1", 1.0, True, None]):
        doc = m.doc()
        doc["version"] = version
        m.add(f"version-type-{index}", doc, MalformedFileError)
    for index, fmt in enumerate(["nnschemaparser-trace", "other", None, 1]):
        doc = m.doc()
        doc["format"] = fmt
        m.add(f"format-{index}", doc, FormatVersionError)
    for key, error in (("version", MalformedFileError), ("format", FormatVersionError),
                       ("root", MalformedFileError), ("files", MalformedFileError)):
        doc = m.doc()
        del doc[key]
        m.add(f"missing-top-{key}", doc, error)
    doc = m.doc()
    doc["extra"] = {}
    m.add("unknown-top-field", doc, MalformedFileError)
    # 2. missing and unknown fields of each kind of record
    kinds = {
        "block": (_blocks, ("name", "path", "module_type", "method_name", "skip_reason", "wrapped", "inputs",
                            "outputs", "weights", "input_defaults", "skipped", "signature")),
        "function": (_functions, ("name", "params", "body", "file", "source", "weight_refs", "self_name")),
        "op": (lambda d: _instrs(d, "op"), ("target", "args", "kwargs", "star_args", "style", "out_var",
                                           "resolved", "location")),
        "control": (lambda d: _instrs(d, "control"), ("kind", "prepare", "condition", "cond_var", "body",
                                                     "bind_var")),
        "try": (lambda d: _instrs(d, "try"), ("handlers", "handler_names", "handler_bodies", "final_body")),
        "const": (_consts, ("text", "value")),
    }
    for kind, (finder, keys) in kinds.items():
        for key in keys:
            doc = m.doc()
            victim = m.pick([r for r in finder(doc) if key in r])
            del victim[key]
            m.add(f"missing-{kind}-{key}", doc, MalformedFileError)
        doc = m.doc()
        m.pick(finder(doc))["__class__"] = "x"
        m.add(f"unknown-{kind}-field", doc, MalformedFileError)
    # a source location's column range: exactly [col, end_line, end_col], non-negative integers
    for index, cols in enumerate([[1, 2], [1, 2, 3, 4], ["1", 2, 3], [1, -2, 3], {"col": 1}, [1.5, 2, 3]]):
        doc = m.doc()
        located = m.pick([r for r in _instrs(doc) if r.get("location")])
        located["location"]["cols"] = cols
        m.add(f"location-cols-{index}", doc, MalformedFileError)
    # 3. mistyped fields
    for key, bad in _TYPED_FIELDS.items():
        doc = m.doc()
        holders = _records(doc, lambda d, k=key: k in d and ("type" in d or "module_type" in d or "params" in d
                                                             or "line" in d))
        if not holders:
            continue
        holder = m.pick(holders)
        holder[key] = bad
        m.add(f"mistyped-{key}", doc)
    # 4. callables outside the allowlist, as targets and as values
    for index, name in enumerate(_DANGEROUS_CALLABLES):
        doc = m.doc()
        op = m.pick([op for op in _instrs(doc, "op") if op["target"].get("kind") == "callable"])
        op["target"] = {"kind": "callable", "name": name}
        op["args"] = [f"open({m.canary!r}, 'w').write('x')"]
        m.add(f"callable-target-{index}", doc, UnsafeReferenceError)
    for index, name in enumerate(_DANGEROUS_CALLABLES[:12]):
        doc = m.doc()
        m.pick(_consts(doc))["value"] = {"kind": "callable", "name": name}
        m.add(f"callable-value-{index}", doc, UnsafeReferenceError)
    for index, qualname in enumerate(_DANGEROUS_GLOBALS):
        doc = m.doc()
        op = m.pick(_instrs(doc, "op"))
        op["target"] = {"kind": "global", "namespace": "hostile_corpus", "name": qualname.rsplit(".", 1)[-1],
                        "type": "function", "qualname": qualname}
        op["args"] = [m.canary]
        m.add(f"global-{index}", doc, UnsafeReferenceError)
    # 5. attribute names
    for index, attr in enumerate(_DANGEROUS_ATTRIBUTES):
        doc = m.doc()
        op = m.pick(_ops_with(doc, "builtins.getattr"))
        op["args"][1] = attr
        m.add(f"getattr-{index}", doc, UnsafeReferenceError)
    for index, attr in enumerate(["__class__", "__dict__", "__code__", "forward ", "system"]):
        doc = m.doc()
        op = m.pick(_ops_with(doc, "builtins.getattr"))
        op["target"] = {"kind": "callable", "name": "builtins.setattr"}
        op["args"] = [op["args"][0], attr, {"kind": "callable", "name": "torch.add"}]
        m.add(f"setattr-{index}", doc, UnsafeReferenceError)
    for index, attr in enumerate(["__init__", "load_state_dict", "__reduce_ex__", "1x", "_C"]):
        doc = m.doc()
        block = m.pick(_instrs(doc, "block"))
        block["block_ref"]["method"] = attr
        m.add(f"block-method-{index}", doc, SchemaFormatError)
    for index, path in enumerate(["__class__", "gate.__dict__", "_C", "layers..0", "mro"]):
        doc = m.doc()
        m.pick(_instrs(doc, "block"))["block_ref"]["path"] = path
        m.add(f"block-path-{index}", doc, SchemaFormatError)
    for index, attr in enumerate(["__dict__", "__globals__", "_C", "f_globals"]):
        doc = m.doc()
        fn = m.pick([f for f in _functions(doc) if f["weight_refs"]] or _functions(doc))
        fn["weight_refs"]["w"] = attr
        m.add(f"weight-ref-{index}", doc, UnsafeReferenceError)
    for index, key in enumerate(["__init__", "a b", "x.__globals__"]):
        doc = m.doc()
        owner = m.pick([b for b in _blocks(doc) if b.get("methods")])
        method = copy.deepcopy(next(iter(owner["methods"].values())))
        method["method_name"] = key
        owner["methods"][key] = method
        m.add(f"method-key-{index}", doc, SchemaFormatError)
    for index, value in enumerate([{"kind": "callable", "name": "builtins.len"}, 3, "ValueError",
                                   {"kind": "callable", "name": "builtins.int"}]):
        doc = m.doc()
        m.pick(_instrs(doc, "try"))["handlers"][0][0] = value
        m.add(f"handler-{index}", doc, SchemaFormatError)
    # 6. forbidden values, in a constant and as an argument
    for index, value in enumerate(_FORBIDDEN_VALUES):
        doc = m.doc()
        m.pick(_consts(doc))["value"] = copy.deepcopy(value)
        m.add(f"value-{index}", doc, SchemaFormatError)
    for index, value in enumerate(_FORBIDDEN_VALUES[:10]):
        doc = m.doc()
        m.pick([op for op in _instrs(doc, "op") if op["args"]])["args"][0] = copy.deepcopy(value)
        m.add(f"argument-{index}", doc, SchemaFormatError)
    # 7. shapes and numbers
    for index, shape in enumerate([[-1], [1.5], ["2"], [2 ** 63], "2x3", [[2]], list(range(80)), [True]]):
        doc = m.doc()
        m.pick(_records(doc, lambda d: "shape" in d and "dtype" in d))["shape"] = shape
        m.add(f"shape-{index}", doc, MalformedFileError)
    text = _dump(m.base).decode()
    anchor = text.index('"shape":[') + len('"shape":[')
    for index, token in enumerate(["NaN,", "Infinity,", "-Infinity,", "1e999,", "9" * 500 + ","]):
        m.add(f"number-token-{index}", (text[:anchor] + token + text[anchor:]).encode())
    # 8. structure of the tree
    doc = m.doc()
    child = m.pick([b for b in _blocks(doc) if b["path"]])
    child["path"] = child["path"] + "x"
    m.add("tree-path-mismatch", doc, MalformedFileError)
    doc = m.doc()
    doc["root"]["sub_blocks"]["gate.lin"] = copy.deepcopy(doc["root"]["sub_blocks"]["gate"]["sub_blocks"]["lin"])
    doc["root"]["sub_blocks"]["gate.lin"]["path"] = "gate.lin"
    m.add("tree-duplicate-path", doc, MalformedFileError)
    doc = m.doc()
    owner = m.pick([b for b in _blocks(doc) if b.get("methods")])
    next(iter(owner["methods"].values()))["method_name"] = "other"
    m.add("tree-method-name-mismatch", doc, MalformedFileError)
    doc = m.doc()
    owner = m.pick([b for b in _blocks(doc) if b.get("methods")])
    next(iter(owner["methods"].values()))["methods"] = {}
    m.add("tree-method-with-methods", doc, MalformedFileError)
    doc = m.doc()
    m.pick([b for b in _blocks(doc) if b["path"]])["method_name"] = "forward"
    m.add("tree-child-named-method", doc, MalformedFileError)
    doc = m.doc()
    del m.pick([b for b in _blocks(doc) if b["path"]])["sub_blocks"]
    m.add("tree-no-children-field", doc, MalformedFileError)
    for index, stars in enumerate([[99], [0, 0], [-1], ["0"]]):
        doc = m.doc()
        m.pick([op for op in _instrs(doc, "op") if op["args"]])["star_args"] = stars
        m.add(f"star-args-{index}", doc, MalformedFileError)
    for index, file_index in enumerate([99, -1, 1.0]):
        doc = m.doc()
        m.pick(_functions(doc))["file"] = file_index
        m.add(f"file-index-{index}", doc, MalformedFileError)
    doc = m.doc()
    doc["files"][0] = {"path": "/etc/passwd", "module": "os", "open": True}
    m.add("file-entry-unknown-field", doc, MalformedFileError)
    for index, kind in enumerate(["exec", "import", "pickle", "eval", None, 7]):
        doc = m.doc()
        m.pick(_instrs(doc, "op"))["type"] = kind
        m.add(f"instruction-type-{index}", doc, MalformedFileError)
    for index, kind in enumerate(["exec", "goto", "IF"]):
        doc = m.doc()
        m.pick(_instrs(doc, "control"))["kind"] = kind
        m.add(f"control-kind-{index}", doc, MalformedFileError)
    doc = m.doc()
    m.pick(_instrs(doc, "try"))["handler_names"].append("extra")
    m.add("try-length-mismatch", doc, MalformedFileError)
    # a control instruction's condition: one op binding cond_var (a named test runs nothing)
    doc = m.doc()
    control = m.pick(_instrs(doc, "control"))
    control["condition"] = [control["condition"]]  # the shape of version 1
    m.add("condition-as-list", doc, MalformedFileError)
    doc = m.doc()
    m.pick(_instrs(doc, "control"))["condition"] = copy.deepcopy(m.pick(_instrs(doc, "return")))
    m.add("condition-not-an-op", doc, MalformedFileError)
    doc = m.doc()
    m.pick(_instrs(doc, "control"))["condition"]["out_var"] = "other"
    m.add("condition-binds-another-variable", doc, MalformedFileError)
    named = [c for c in _instrs(m.base, "control") if c["condition"]["style"] == "test"]
    assert named, "the corpus model has a named test (its comprehension's `.0`)"
    for index, change in enumerate([{"target": {"kind": "callable", "name": "torch.add"}},
                                    {"args": [{"kind": "var", "name": "x"}]},
                                    {"args": [{"kind": "var", "name": ".0"}, 1]},
                                    {"kwargs": {"k": 1}}, {"args_var": "x"}, {"mutates": True}]):
        doc = m.doc()
        m.pick([c for c in _instrs(doc, "control") if c["condition"]["style"] == "test"])["condition"].update(change)
        m.add(f"named-test-{index}", doc, MalformedFileError)
    doc = m.doc()
    op_condition = m.pick([c for c in _instrs(doc, "control") if c["condition"]["style"] != "test"])
    op_condition["condition"]["style"] = "test"  # an op that runs, marked as one that does not
    m.add("named-test-hiding-an-op", doc, MalformedFileError)
    doc = m.doc()
    m.pick([f for f in _functions(doc) if f["body"]])["body"].insert(0, copy.deepcopy(named[0]["condition"]))
    m.add("named-test-in-a-body", doc, MalformedFileError)
    doc = m.doc()
    fn_instr = m.pick(_instrs(doc, "function"))
    fn_instr["defaults"] = [1] * (len(fn_instr["function"]["params"]) + 1)
    m.add("function-too-many-defaults", doc, MalformedFileError)
    # 9. nesting, size and encoding
    m.add("depth-bomb-arrays", b"[" * 100_000 + b"]" * 100_000, FileLimitError)
    m.add("depth-bomb-objects", b'{"a":' * 50_000 + b"1" + b"}" * 50_000, FileLimitError)
    doc = m.doc()
    nested: Any = 1
    for _ in range(300):
        nested = {"kind": "tuple", "items": [nested]}
    m.pick([op for op in _instrs(doc, "op") if op["args"]])["args"][0] = nested
    m.add("depth-bomb-operand", doc, FileLimitError)
    doc = m.doc()
    block: Any = doc["root"]
    for level in range(150):
        child = copy.deepcopy(_blocks(m.base)[-1])
        child.update(path=("a." * level + "a").strip("."), sub_blocks={}, methods={})
        block["sub_blocks"] = {"a": child}
        block = child
    m.add("depth-bomb-blocks", doc, FileLimitError)
    m.add("too-big-for-limit", _dump(m.base), FileLimitError, limits=FileLimits(max_file_bytes=1000))
    m.add("string-over-limit", _dump(m.base), FileLimitError, limits=FileLimits(max_string_chars=20))
    m.add("depth-over-limit", _dump(m.base), FileLimitError, limits=FileLimits(max_depth=5))
    doc = m.doc()
    m.pick(_consts(doc))["value"] = "A" * 200_000
    m.add("long-string", doc, FileLimitError, limits=FileLimits(max_string_chars=100_000))
    dup = text.replace('"out_var":"', '"out_var":"dup","out_var":"', 1)
    m.add("duplicate-key-instruction", dup.encode(), MalformedFileError)
    m.add("duplicate-key-top", text.replace('{"format"', '{"version":1,"format"', 1).encode(), MalformedFileError)
    m.add("utf16", text.encode("utf-16"), MalformedFileError)
    m.add("bad-utf8", text.encode()[:200] + b"\xff\xfe" + text.encode()[200:], MalformedFileError)
    m.add("trailing-garbage", text.encode() + b" {}", MalformedFileError)
    m.add("comment", b"// hi\n" + text.encode(), MalformedFileError)
    m.add("empty", b"", MalformedFileError)
    m.add("whitespace", b"   \n", MalformedFileError)
    m.add("top-level-array", b"[1, 2, 3]", MalformedFileError)
    m.add("top-level-string", b'"nnschemaparser-schema"', MalformedFileError)
    size = len(text)
    for index, cut in enumerate(sorted({int(size * f) for f in [0.01 * k for k in range(1, 100, 4)]} | {size - 1})):
        m.add(f"truncated-{index}", text[:cut].encode(), MalformedFileError)


def _handwritten_attacks(m: _Maker) -> None:
    canary = m.canary

    class Payload:
        def __reduce__(self):
            return (touch_canary, (canary,))

    m.add("pickle-payload", pickle.dumps(Payload()), MalformedFileError)
    m.add("pickle-protocol-0", pickle.dumps(Payload(), protocol=0), MalformedFileError)
    archive = io.BytesIO()
    torch.save({"x": torch.zeros(2), "payload": "touch"}, archive)
    m.add("torch-save-archive", archive.getvalue(), MalformedFileError)
    m.add("python-source", f"import os; os.system('touch {canary}')".encode(), MalformedFileError)
    exec_doc = m.doc()
    exec_doc["root"]["signature"]["body"].insert(0, {
        "type": "op", "out_var": "$pwn", "resolved": None, "location": None,
        "target": {"kind": "callable", "name": "builtins.exec"}, "qualified_name": "builtins.exec",
        "display_name": "exec", "args": [f"open({canary!r}, 'w').write('x')"], "kwargs": {},
        "args_var": None, "kwargs_var": None, "star_args": [], "mutates": False, "style": "call"})
    m.add("exec-instruction", exec_doc, UnsafeReferenceError)
    chain = m.doc()
    body = chain["root"]["signature"]["body"]
    steps = [("$a", "builtins.tuple", [[]]), ("$b", "builtins.getattr", [{"kind": "var", "name": "$a"}, "__class__"]),
             ("$c", "builtins.getattr", [{"kind": "var", "name": "$b"}, "__base__"]),
             ("$d", "builtins.getattr", [{"kind": "var", "name": "$c"}, "__subclasses__"])]
    for index, (out, name, args) in enumerate(steps):
        body.insert(index, {"type": "op", "out_var": out, "resolved": None, "location": None,
                            "target": {"kind": "callable", "name": name}, "qualified_name": name, "display_name": name,
                            "args": args, "kwargs": {}, "args_var": None, "kwargs_var": None, "star_args": [],
                            "mutates": False, "style": "call"})
    m.add("subclasses-escape-chain", chain, UnsafeReferenceError)
    computed = m.doc()
    op = m.pick(_ops_with(computed, "builtins.getattr"))
    op["target"] = {"kind": "callable", "name": "operator.attrgetter"}
    m.add("attrgetter-escape", computed, UnsafeReferenceError)
    # with the model: what the model's code does not name is refused, even from its own module
    for index, (name, qualname) in enumerate([("touch_canary", "hostile_corpus.touch_canary"),
                                              ("touch_canary", "tests.support.hostile_corpus.touch_canary"),
                                              ("halve", "hostile_corpus.touch_canary"),
                                              ("Path", "pathlib.Path"), ("halve", "hostile_corpus.halve.x")]):
        doc = m.doc()
        op = m.pick([o for o in _instrs(doc, "op") if o["target"].get("kind") == "global"])
        op["target"] = {"kind": "global", "namespace": op["target"]["namespace"], "name": name, "type": "function",
                        "qualname": qualname}
        op["args"] = [canary]
        m.add(f"model-global-{index}", doc, UnsafeReferenceError, with_model=True)
    doc = m.doc()
    doc["root"]["sub_blocks"]["gate"]["sub_blocks"]["lin"]["weights"]["weight"]["shape"] = [7, 6]
    m.add("model-weight-shape", doc, ModelMismatchError, with_model=True)
    doc = m.doc()
    doc["root"]["sub_blocks"]["gate"]["module_type"] = "os._wrap_close"
    m.add("model-module-type", doc, ModelMismatchError, with_model=True)
    doc = m.doc()
    doc["root"]["sub_blocks"]["gate"]["wrapped"] = True
    m.add("model-decorator-claimed", doc, ModelMismatchError, with_model=True)
    doc = m.doc()
    del doc["root"]["sub_blocks"]["gate"]
    m.add("model-missing-child", doc, ModelMismatchError, with_model=True)


def build_corpus(canary: str, seed: int = 0) -> list[Hostile]:
    """Every hostile file, in a fixed order; `canary` is the path their payloads aim at."""
    rng = random.Random(seed)
    files = base_files()
    maker = _Maker(json.loads(files["schema"]), canary, rng)
    _schema_mutations(maker)
    _handwritten_attacks(maker)
    entries = maker.entries
    for label in ("activation", "gradient"):
        for name, data, error, limits in trace_mutations(label, files[label], rng):
            entries.append(Hostile(name, "trace", data, error, limits=limits))
    # "bound": refused by the memory budget (FileLimits.max_decode_ratio); the scalar bombs spliced
    # into an operand are loaded with the model too
    with_model = {"bomb-short-strings", "bomb-floats", "bomb-unique-keys"}
    for name, data, error, limits, bound in schema_bombs(json.loads(files["schema"])):
        entries.append(Hostile(name, "schema", data, error, with_model=name in with_model, limits=limits,
                               notes={"bound": bound}))
    for label in ("activation", "gradient"):
        for name, data, error, limits, bound in trace_bombs(label, files[label]):
            entries.append(Hostile(name, "trace", data, error, limits=limits, notes={"bound": bound}))
    entries.append(Hostile("trace-is-a-schema", "trace", files["schema"], SchemaFormatError))
    entries.append(Hostile("schema-is-a-trace", "schema", files["activation"], MalformedFileError))
    archive = io.BytesIO()
    torch.save({"w": torch.zeros(3)}, archive)
    entries.append(Hostile("trace-torch-save-archive", "trace", archive.getvalue(), SchemaFormatError))
    names = [entry.name for entry in entries]
    assert len(names) == len(set(names)), "corpus entry names must be unique"
    return entries
