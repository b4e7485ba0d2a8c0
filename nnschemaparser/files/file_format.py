"""The rules every saved nnschemaparser file follows: strict JSON, size limits and typed refusals.

Schema files and trace files share this layer. It reads JSON the strict way (no duplicate keys, no
NaN/Infinity tokens, no number that overflows, nesting bounded before the parser sees it), checks
records field by field (an unknown field is refused, a missing one too) and raises one typed error
per kind of problem, always naming the file, the entry and what to do:

    SchemaFormatError                 (errors.py) a saved schema or trace file is malformed or unsafe
    ├── MalformedFileError            not JSON, a field of the wrong type, a truncated file, ...
    ├── FormatVersionError            another format, or a version this release does not read
    ├── FileLimitError                the file exceeds a FileLimits bound (size, nesting, counts)
    ├── UnsafeReferenceError          a callable, global or attribute outside the allowlist
    └── ModelMismatchError            load_schema(model=...) got a model of another structure

Depends on errors and the standard library only; knows nothing about schemas, traces or torch.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from ..schema.errors import SchemaFormatError

__all__ = [
    "FileLimits",
    "MalformedFileError",
    "FormatVersionError",
    "FileLimitError",
    "UnsafeReferenceError",
    "ModelMismatchError",
    "read_bounded",
    "parse_json",
    "decoded_size_bound",
    "check_decoded_size",
    "dump_json",
    "write_atomic",
    "check_header",
    "record",
    "get_str",
    "get_opt_str",
    "get_int",
    "get_bool",
    "get_list",
    "get_dict",
    "get_str_list",
    "get_str_dict",
]


class MalformedFileError(SchemaFormatError):
    """The file is not what the format describes: bad JSON, a wrong field, a truncated file."""


class FormatVersionError(SchemaFormatError):
    """The file is of another format, or of a version this release does not read."""


class FileLimitError(SchemaFormatError):
    """The file exceeds one of the FileLimits bounds."""


class UnsafeReferenceError(SchemaFormatError):
    """The file names a callable, a global or an attribute that loading must not resolve."""


class ModelMismatchError(SchemaFormatError):
    """The model given to load_schema does not have the structure the file describes."""


@dataclass(frozen=True)
class FileLimits:
    """Bounds a loader enforces before it allocates anything the file asks for.

    `max_file_bytes` bounds the bytes read (nothing larger is read at all); `max_depth` the nesting
    of JSON arrays and objects; `max_string_chars` any one string; `max_header_bytes` the JSON header
    of a trace file; `max_tensors` the tensors of one trace; `max_dims` the rank of one shape.
    `max_decoded_bytes` and `max_decode_ratio` bound what a JSON text may cost once decoded: before
    any structure is built, an upper bound of its Python size is computed from the bytes (see
    `decoded_size_bound`) and must stay under `max_decoded_bytes` and under `max_decode_ratio`
    times the text's size (real files are at 18-21; bombs of empty containers at 30 and more).
    """

    max_file_bytes: int = 512 * 1024 * 1024
    max_depth: int = 128
    max_string_chars: int = 4 * 1024 * 1024
    max_header_bytes: int = 128 * 1024 * 1024
    max_tensors: int = 1_000_000
    max_dims: int = 64
    max_decoded_bytes: int = 2 * 1024 * 1024 * 1024
    max_decode_ratio: int = 24

    def __post_init__(self) -> None:
        for name in ("max_file_bytes", "max_depth", "max_string_chars", "max_header_bytes", "max_tensors",
                     "max_dims", "max_decoded_bytes", "max_decode_ratio"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"FileLimits.{name} must be a positive int, got {value!r}")


# --- reading and writing bytes ----------------------------------------------------------------


def read_bounded(path: str | os.PathLike, limits: FileLimits, what: str) -> bytes:
    """The bytes of `path`, refusing (before reading) a file larger than `limits.max_file_bytes`."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > limits.max_file_bytes:
                raise FileLimitError(f"{path}: the {what} file is {size} bytes, over the limit of "
                                     f"{limits.max_file_bytes}; pass limits=FileLimits(max_file_bytes=...) "
                                     "if you trust it")
            data = handle.read(size)  # read(n) reserves n bytes first: never more than the file's size
            if handle.read(1):
                raise MalformedFileError(f"{path}: the {what} file grew while it was read; read it again once "
                                         "it is complete")
    except FileNotFoundError:
        raise FileNotFoundError(f"no {what} file at {path}") from None
    return data


def write_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write `data` to a temporary file next to `path`, then rename it over `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def dump_json(document: Any) -> bytes:
    """Compact JSON, ASCII only, refusing NaN/Infinity (the codecs tag non-finite floats)."""
    return json.dumps(document, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


# --- strict JSON ------------------------------------------------------------------------------

_MAX_INT_DIGITS = 400


def _check_shape(document: Any, limits: FileLimits, source: str) -> None:
    """Refuse nesting deeper than `max_depth` and strings longer than `max_string_chars`.

    The C decoder bounds its own recursion (RecursionError, refused below), so the walk can run on
    the decoded document: iterative, one visit per container.
    """
    deepest, longest = limits.max_depth, limits.max_string_chars
    stack = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            raise FileLimitError(f"{source}: JSON nesting deeper than {deepest} levels; a real file is far shallower, "
                                 "so it is refused")
        items = node.items() if type(node) is dict else enumerate(node)
        for key, value in items:
            kind = type(value)
            if kind is str:
                if len(value) > longest:
                    raise FileLimitError(f"{source}: a string of {len(value)} characters is over the limit of "
                                         f"{longest}")
            elif kind is dict or kind is list:
                stack.append((value, depth + 1))
            if type(key) is str and len(key) > longest:
                raise FileLimitError(f"{source}: a key of {len(key)} characters is over the limit of {longest}")


def _pairs(source: str):
    def hook(pairs: list[tuple[str, Any]]) -> dict:
        result: dict = {}
        for key, value in pairs:
            if key in result:
                raise MalformedFileError(f"{source}: duplicate key {key!r} in one JSON object; a file with "
                                         "duplicate keys is ambiguous and refused")
            result[key] = value
        return result

    return hook


def _constant(source: str):
    def hook(token: str) -> Any:
        raise MalformedFileError(f"{source}: the JSON token {token} is not allowed; non-finite numbers are written "
                                 "as tagged values ({\"kind\": \"float\", \"value\": \"nan\"}) where allowed")

    return hook


def _float(source: str):
    def hook(token: str) -> float:
        value = float(token)
        if not math.isfinite(value):
            raise MalformedFileError(f"{source}: the number {token[:40]} overflows a float")
        return value

    return hook


def _int(source: str):
    def hook(token: str) -> int:
        if len(token.lstrip("-")) > _MAX_INT_DIGITS:
            raise FileLimitError(f"{source}: an integer of {len(token)} digits is over the limit of "
                                 f"{_MAX_INT_DIGITS}")
        return int(token)

    return hook


# Upper bounds, in bytes, of what one token costs once decoded by json + the hooks above (CPython,
# 64-bit): `[` a list (56 + over-allocation); `{` the pairs list and the dict; both also the entry
# `_check_shape` stacks for them (64); `:` the pair tuple, the dict entry and its growth; `,` a slot
# and a number object; `"` half a string header. Every string's characters and the decoded text
# itself are covered by twice the length.
_TOKEN_COST = ((b"[", 136), (b"{", 296), (b":", 128), (b",", 48), (b'"', 25))
_DECODE_FIXED = 16 * 1024  # the decoder's own objects (hooks, scanner), whatever the text


def decoded_size_bound(data: bytes, start: int = 0, end: Optional[int] = None) -> int:
    """An upper bound of the memory `parse_json(data[start:end])` allocates, from byte counts alone.

    Counting runs in C over the bytes and allocates nothing (not even the slice), so a refused file
    costs only itself. Characters inside strings are counted too, which only raises the bound.
    """
    end = len(data) if end is None else end
    return _DECODE_FIXED + 2 * (end - start) + sum(cost * data.count(token, start, end) for token, cost in _TOKEN_COST)


def check_decoded_size(data: bytes, limits: FileLimits, source: str, start: int = 0,
                       end: Optional[int] = None) -> None:
    """Refuse a JSON text (`data[start:end]`) whose decoded form could pass the limits, before decoding it."""
    end = len(data) if end is None else end
    bound = decoded_size_bound(data, start, end)
    size = end - start
    if bound > limits.max_decoded_bytes:
        raise FileLimitError(f"{source}: decoding these {size} bytes could take up to {bound} bytes, over "
                             f"the limit of {limits.max_decoded_bytes}; pass limits=FileLimits(max_decoded_bytes=...)"
                             " if you trust the file")
    amplified = bound - _DECODE_FIXED  # what grows with the text
    if amplified > limits.max_decode_ratio * max(size, 4096):
        raise FileLimitError(f"{source}: these {size} bytes would decode to up to {bound} bytes "
                             f"({amplified / max(size, 1):.0f} times the text; the limit is "
                             f"{limits.max_decode_ratio}): the file is dense with empty or tiny containers, as a "
                             "memory bomb is, and is refused before decoding")


def parse_json(data: bytes, limits: FileLimits, source: str) -> Any:
    """Decode UTF-8 JSON strictly; every refusal is a typed SchemaFormatError naming `source`."""
    if len(data) > limits.max_file_bytes:
        raise FileLimitError(f"{source}: {len(data)} bytes of JSON, over the limit of {limits.max_file_bytes}")
    check_decoded_size(data, limits, source)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedFileError(f"{source}: not UTF-8 text (byte {exc.start}); is this a schema or trace "
                                 "file written by save_schema / save_trace?") from None
    try:
        document = json.loads(text, object_pairs_hook=_pairs(source), parse_constant=_constant(source),
                              parse_float=_float(source), parse_int=_int(source))
    except json.JSONDecodeError as exc:
        hint = " (the file ends early: truncated?)" if exc.pos >= len(text.rstrip()) else ""
        raise MalformedFileError(f"{source}: not valid JSON at line {exc.lineno} column {exc.colno}: "
                                 f"{exc.msg}{hint}") from None
    except RecursionError:
        raise FileLimitError(f"{source}: JSON nesting deeper than {limits.max_depth} levels (too deep to decode); "
                             "a real file is far shallower, so it is refused") from None
    except MemoryError:
        raise FileLimitError(f"{source}: decoding {len(data)} bytes of JSON ran out of memory; the file is refused "
                             "(lower FileLimits.max_decoded_bytes to refuse such files before decoding)") from None
    if type(document) is str and len(document) > limits.max_string_chars:
        raise FileLimitError(f"{source}: a string of {len(document)} characters is over the limit")
    if type(document) is dict or type(document) is list:
        _check_shape(document, limits, source)
    return document


def check_header(document: Any, format_name: str, version: int, source: str) -> dict:
    """The top-level object of a file of `format_name`: refuses other formats and other versions."""
    if not isinstance(document, dict):
        raise MalformedFileError(f"{source}: the top level must be a JSON object, got {_kind(document)}")
    found = document.get("format")
    if found != format_name:
        raise FormatVersionError(f"{source}: this is not a {format_name} file (its \"format\" is "
                                 f"{_short(found)}); write it with the matching save function")
    got = document.get("version")
    if type(got) is not int:
        raise MalformedFileError(f"{source}: \"version\" must be an integer, got {_short(got)}")
    if got != version:
        newer = "a newer" if got > version else "an older"
        raise FormatVersionError(f"{source}: format version {got} comes from {newer} nnschemaparser; this release "
                                 f"reads version {version} only. Re-save the file with this release, or upgrade")
    return document


# --- records ----------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else _kind(value)
    return text if len(text) <= 60 else text[:57] + "..."


def record(value: Any, where: str, required: Iterable[str], optional: Iterable[str] = ()) -> dict:
    """`value` as an object with exactly the `required` fields and some of the `optional` ones."""
    if not isinstance(value, dict):
        raise MalformedFileError(f"{where}: expected an object, got {_kind(value)}")
    required = tuple(required)
    known = set(required) | set(optional)
    unknown = [key for key in value if key not in known]
    if unknown:
        raise MalformedFileError(f"{where}: unknown field {unknown[0]!r}; this format version knows "
                                 f"{', '.join(sorted(known))}")
    missing = [key for key in required if key not in value]
    if missing:
        raise MalformedFileError(f"{where}: missing field {missing[0]!r}")
    return value


def get_str(obj: dict, key: str, where: str, *, max_chars: Optional[int] = None) -> str:
    value = obj[key]
    if type(value) is not str:
        raise MalformedFileError(f"{where}.{key}: expected a string, got {_kind(value)}")
    if max_chars is not None and len(value) > max_chars:
        raise FileLimitError(f"{where}.{key}: {len(value)} characters, over the limit of {max_chars}")
    return value


def get_opt_str(obj: dict, key: str, where: str) -> Optional[str]:
    if obj.get(key) is None:
        return None
    return get_str(obj, key, where)


def get_int(obj: dict, key: str, where: str, *, low: int = 0, high: int = 2 ** 63 - 1) -> int:
    value = obj[key]
    if type(value) is not int:
        raise MalformedFileError(f"{where}.{key}: expected an integer, got {_kind(value)}")
    if not low <= value <= high:
        raise MalformedFileError(f"{where}.{key}: {value} is outside {low}..{high}")
    return value


def get_bool(obj: dict, key: str, where: str) -> bool:
    value = obj[key]
    if type(value) is not bool:
        raise MalformedFileError(f"{where}.{key}: expected true or false, got {_kind(value)}")
    return value


def get_list(obj: dict, key: str, where: str) -> list:
    value = obj[key]
    if type(value) is not list:
        raise MalformedFileError(f"{where}.{key}: expected an array, got {_kind(value)}")
    return value


def get_dict(obj: dict, key: str, where: str) -> dict:
    value = obj[key]
    if type(value) is not dict:
        raise MalformedFileError(f"{where}.{key}: expected an object, got {_kind(value)}")
    return value


def get_str_list(obj: dict, key: str, where: str) -> list[str]:
    items = get_list(obj, key, where)
    for index, item in enumerate(items):
        if type(item) is not str:
            raise MalformedFileError(f"{where}.{key}[{index}]: expected a string, got {_kind(item)}")
    return list(items)


def get_str_dict(obj: dict, key: str, where: str) -> dict[str, str]:
    items = get_dict(obj, key, where)
    for name, item in items.items():
        if type(item) is not str:
            raise MalformedFileError(f"{where}.{key}[{name!r}]: expected a string, got {_kind(item)}")
    return dict(items)
