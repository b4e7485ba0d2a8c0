"""save_schema / load_schema: a schema tree as a versioned JSON file, loaded without running anything.

The file (docs/FORMAT.md) holds the blocks, instructions, resolved shapes and dtypes, inputs and
defaults, skipped children and their reasons; never weights, never a live module, never pickle.

`load_schema(path)` gives a schema to walk, dump and summarise; running it says the model is needed.
`load_schema(path, model=m)` also binds it to the live model: it lowers `m` again from its current
source (nothing runs), refuses a model whose module types per path or weights differ from the file,
and requires the file's instruction stream to equal that fresh lowering (verification.py: the
verification rule). What it returns *is* the fresh lowering, bound to `m`'s modules and weights,
carrying only the file's viewer data (resolved shapes and dtypes, block inputs and outputs, which
children ran as the real module). So a file can run nothing the model's own source does not run;
a file that differs is refused with SourceMismatchError naming the first differing instruction.
The bound schema then runs bit for bit like the schema it was saved from.

Depends on schema_codec, value_codec, file_format, verification (the fresh lowering) and schema.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from torch import nn

from .file_format import (
    DecodeBudget,
    FileLimits,
    ModelMismatchError,
    check_header,
    decode_budget,
    dump_json,
    parse_json,
    read_bounded,
    write_atomic,
)
from ..parser.special_modules import weight_repr
from ..schema.model import ModelBlockSchema
from .schema_codec import FORMAT_NAME, FORMAT_VERSION, OLD_VERSION_FIX, OLD_VERSIONS, SchemaDecoder, SchemaEncoder
from .value_codec import Resolver
from .verification import lower_model, verified_schema

__all__ = ["save_schema", "load_schema", "schema_to_json", "schema_from_json"]

_SHOWN = 5


def schema_to_json(schema: ModelBlockSchema) -> dict:
    """The JSON document of `schema`, as save_schema writes it."""
    return SchemaEncoder().document(schema)


def save_schema(schema: ModelBlockSchema, path: str | os.PathLike) -> Path:
    """Write `schema` to `path` as a schema file (JSON, format version 2); returns the path.

    Weights are not written: load the file with `load_schema(path, model=...)` to run it.
    """
    return write_atomic(path, dump_json(schema_to_json(schema)))


def schema_from_json(document: Any, model: Optional[nn.Module] = None, *, limits: Optional[FileLimits] = None,
                     source: str = "<schema document>", budget: Optional[DecodeBudget] = None) -> ModelBlockSchema:
    """Rebuild a schema from an already parsed JSON document (what load_schema does after reading).

    The schema's objects are charged to `budget` (load_schema's: the file's memory bound; by default
    FileLimits.max_decoded_bytes). With a model, lowering the model is the model's cost, not charged.
    """
    limits = limits or FileLimits()
    check_header(document, FORMAT_NAME, FORMAT_VERSION, source, OLD_VERSIONS, OLD_VERSION_FIX)
    if model is None:
        return SchemaDecoder(Resolver(), limits, source, budget).document(document)
    if not isinstance(model, nn.Module):
        raise ModelMismatchError(f"model must be the nn.Module instance the schema was saved from, got "
                                 f"{type(model).__name__}; call load_schema(path, model=your_model)")
    decoded = SchemaDecoder(Resolver(), limits, source, budget).document(document)  # inert: checks every record
    fresh = lower_model(model)
    _check_structure(decoded, fresh, source)
    return verified_schema(document, decoded, fresh, source)


def load_schema(path: str | os.PathLike, model: Optional[nn.Module] = None, *,
                limits: Optional[FileLimits] = None) -> ModelBlockSchema:
    """Read a schema file. Nothing in the file is imported, evaluated or called while loading.

    Without `model` the schema can be walked, dumped and summarised; with it, it runs exactly like
    the schema that was saved. A malformed or unsafe file raises a SchemaFormatError subclass.
    """
    limits = limits or FileLimits()
    source = str(path)
    data = read_bounded(path, limits, "schema")
    size = len(data)
    budget = decode_budget(size, limits, source, held=size)  # FileLimits.max_decode_ratio times the file
    document = parse_json(data, limits, source, budget)
    del data  # the document replaces the text
    budget.release(size)
    return schema_from_json(document, model, limits=limits, source=source, budget=budget)


# --- binding to a live model --------------------------------------------------------------------


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
