"""save_schema / load_schema: a schema tree as a versioned JSON file, loaded without running anything.

The file (docs/FORMAT.md) holds the blocks, instructions, resolved shapes and dtypes, inputs and
defaults, skipped children and their reasons; never weights, never a live module, never pickle.

`load_schema(path)` gives a schema to walk, dump and summarise; running it says the model is needed.
`load_schema(path, model=m)` also binds it to the live model: it lowers `m` again (nothing runs),
refuses a model whose module types per path, weights or decorators differ from the file, resolves
each reference to the model's code only if the model's own code names that very object (so a file
can call nothing the model does not call, beyond the allowlist), and re-binds every block's module
and weights. The bound schema then runs bit for bit like the schema it was saved from.

Depends on schema_codec, value_codec, file_format, parser (for the fresh lowering) and schema.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from torch import nn

from .file_format import (
    FileLimits,
    ModelMismatchError,
    UnsafeReferenceError,
    check_header,
    dump_json,
    parse_json,
    read_bounded,
    write_atomic,
)
from ..parser.model_parser import NNParser, weight_repr
from ..schema.model import ModelBlockSchema
from .schema_codec import FORMAT_NAME, FORMAT_VERSION, SchemaDecoder, SchemaEncoder
from .value_codec import Resolver, UnresolvedReference, qualified_name

__all__ = ["save_schema", "load_schema", "schema_to_json", "schema_from_json"]

_SHOWN = 5


def schema_to_json(schema: ModelBlockSchema) -> dict:
    """The JSON document of `schema`, as save_schema writes it."""
    return SchemaEncoder().document(schema)


def save_schema(schema: ModelBlockSchema, path: str | os.PathLike) -> Path:
    """Write `schema` to `path` as a schema file (JSON, format version 1); returns the path.

    Weights are not written: load the file with `load_schema(path, model=...)` to run it.
    """
    return write_atomic(path, dump_json(schema_to_json(schema)))


def schema_from_json(document: Any, model: Optional[nn.Module] = None, *, limits: Optional[FileLimits] = None,
                     source: str = "<schema document>") -> ModelBlockSchema:
    """Rebuild a schema from an already parsed JSON document (what load_schema does after reading)."""
    limits = limits or FileLimits()
    check_header(document, FORMAT_NAME, FORMAT_VERSION, source)
    if model is None:
        return SchemaDecoder(Resolver(), limits, source).document(document)
    if not isinstance(model, nn.Module):
        raise ModelMismatchError(f"model must be the nn.Module instance the schema was saved from, got "
                                 f"{type(model).__name__}; call load_schema(path, model=your_model)")
    fresh = NNParser.parse_model(model, resolve=False)
    resolver = _ModelResolver(fresh)
    decoder = SchemaDecoder(resolver, limits, source)
    schema = decoder.document(document)
    _check_structure(schema, fresh, source)
    resolver.raise_misses(source)
    _bind(schema, fresh, source)
    return schema


def load_schema(path: str | os.PathLike, model: Optional[nn.Module] = None, *,
                limits: Optional[FileLimits] = None) -> ModelBlockSchema:
    """Read a schema file. Nothing in the file is imported, evaluated or called while loading.

    Without `model` the schema can be walked, dumped and summarised; with it, it runs exactly like
    the schema that was saved. A malformed or unsafe file raises a SchemaFormatError subclass.
    """
    limits = limits or FileLimits()
    source = str(path)
    document = parse_json(read_bounded(path, limits, "schema"), limits, source)
    return schema_from_json(document, model, limits=limits, source=source)


# --- binding to a live model --------------------------------------------------------------------


def _distinct(objects: list) -> list:
    unique: list = []
    for obj in objects:
        if any(obj is seen for seen in unique):
            continue
        try:
            if any(bool(obj == seen) for seen in unique):  # bound methods are equal, not identical
                continue
        except Exception:  # noqa: BLE001 - tensors and odd objects compare by identity only
            pass
        unique.append(obj)
    return unique


class _ModelResolver(Resolver):
    """Resolves a global reference to the object the live model's own code names at the same place."""

    def __init__(self, fresh: ModelBlockSchema):
        collected: dict[tuple[str, str], list] = {}
        SchemaEncoder(collect=collected).document(fresh)
        self.index = collected
        self.by_name: dict[str, list] = {}
        for (_, name), objects in collected.items():
            self.by_name.setdefault(name, []).extend(objects)
        self.misses: list[str] = []

    def resolve_global(self, namespace: str, name: str, kind: str, qualname: str, where: str) -> Any:
        candidates = self.index.get((namespace, name))
        if not candidates:  # the same file may be known under another module name in this process
            candidates = self.by_name.get(name, [])
        matching = _distinct([obj for obj in candidates if qualified_name(obj) == (kind, qualname)])
        if len(matching) == 1:
            return matching[0]
        if matching:
            self.misses.append(f"{where}: {name!r} names {len(matching)} different objects of {qualname} in the "
                               "model's code")
        else:
            self.misses.append(f"{where}: {qualname} (written {name!r} in {namespace or 'the model code'}) is not "
                               "referenced by the model's own code")
        return UnresolvedReference(namespace, name, kind, qualname)

    def raise_misses(self, source: str) -> None:
        if self.misses:
            more = f" (and {len(self.misses) - 1} more)" if len(self.misses) > 1 else ""
            raise UnsafeReferenceError(f"{self.misses[0]}{more}; a schema file may only use the allowlist and what the "
                                       f"model's code itself uses, so {source} is refused for this model")


def _forward_blocks(root: ModelBlockSchema) -> dict[str, ModelBlockSchema]:
    return {block.path: block for block in root.iter_blocks() if block.method_name is None}


def _mismatch(source: str, problems: list[str]) -> ModelMismatchError:
    more = f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
    return ModelMismatchError(f"{source}: the model does not match the schema file: {'; '.join(problems[:_SHOWN])}"
                              f"{more}. Pass the model (same classes and sizes) the schema was saved from")


def _check_structure(schema: ModelBlockSchema, fresh: ModelBlockSchema, source: str) -> None:
    mine, live = _forward_blocks(schema), _forward_blocks(fresh)
    problems = []
    for path, block in mine.items():
        where = repr(path) if path else "the root"
        other = live.get(path)
        if other is None:
            problems.append(f"the file has a {block.module_type} at {where}, the model has no module there")
        elif other.module_type != block.module_type:
            problems.append(f"at {where} the file has {block.module_type}, the model {other.module_type}")
    for path, block in live.items():
        if path not in mine:
            problems.append(f"the model has a {block.module_type} at {path!r}, the file does not")
    for path, block in mine.items():
        module = live[path].module if path in live else None
        if module is None:
            continue
        state = {name: t for store in (module._parameters, module._buffers) for name, t in store.items() if t is not None}
        for name in sorted(set(state) ^ set(block.weights)):
            side = "model" if name in state else "file"
            problems.append(f"{path or 'the root'}: only the {side} has the weight {name!r}")
        for name, rep in block.weights.items():
            live_rep = weight_repr(state[name]) if name in state else None  # a lazy module's has no shape yet
            if live_rep is not None and (tuple(live_rep.shape), live_rep.dtype in _UNINITIALISED) != \
                    (tuple(rep.shape), rep.dtype in _UNINITIALISED):
                problems.append(f"{path or 'the root'}.{name}: shape {_describe(rep)} in the file, "
                                f"{_describe(live_rep)} in the model")
    if problems:
        raise _mismatch(source, problems)


_UNINITIALISED = "UninitializedParameter", "UninitializedBuffer"


def _describe(rep: Any) -> str:
    if rep.dtype in _UNINITIALISED:
        return "not yet inferred (an uninitialised lazy tensor)"
    return str(tuple(rep.shape))


def _bind(schema: ModelBlockSchema, fresh: ModelBlockSchema, source: str) -> None:
    live = _forward_blocks(fresh)
    problems = []
    for block in schema.iter_blocks():
        twin = live[block.path]
        module = twin.module
        if block.method_name is not None:
            method = twin.methods.get(block.method_name)
            wrapper = method.wrapper if method is not None else None
            block.function = method.function if method is not None else None  # the live method, for skips
        else:
            wrapper = twin.wrapper
            state = {name: t for store in (module._parameters, module._buffers) for name, t in store.items()
                     if t is not None}
            block.weights = {name: weight_repr(state[name]) for name in block.weights}
        in_file = block.wrapper is not None
        if in_file != (wrapper is not None) and block.signature is not None:
            label = f"{block.path or 'the root'}.{block.method_name or 'forward'}"
            problems.append(f"{label} is {'decorated' if wrapper is not None else 'not decorated'} in the model "
                            f"but {'decorated' if in_file else 'not decorated'} in the file")
        block.module = module
        block.wrapper = wrapper
    if problems:
        for block in schema.iter_blocks():
            block.module = block.wrapper = block.function = None
        raise _mismatch(source, problems)
