"""The rules every saved nnschemaparser file follows: strict JSON, size limits and typed refusals.

Schema files and trace files share this layer. It reads JSON the strict way (no duplicate keys, no
NaN/Infinity tokens, no number that overflows, nesting bounded before the parser sees it), checks
records field by field (an unknown field is refused, a missing one too) and raises one typed error
per kind of problem, always naming the file, the entry and what to do: `MalformedFileError`,
`FormatVersionError`, `FileLimitError`, `UnsafeReferenceError` and `ModelMismatchError`, each a
`SchemaFormatError` (the package's exception tree, with what each one means, is in schema/errors.py).

Depends on errors and the standard library only; knows nothing about schemas, traces or torch.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from ..schema.errors import SchemaFormatError
from .bounded_json import DecodeBudget, JSONObject, decode_bounded, is_array, is_object

__all__ = [
    "FileLimits",
    "MalformedFileError",
    "FormatVersionError",
    "FileLimitError",
    "UnsafeReferenceError",
    "ModelMismatchError",
    "read_bounded",
    "parse_json",
    "decode_budget",
    "SMALL_FILE_BYTES",
    "object_bytes",
    "DecodeBudget",
    "JSONObject",
    "is_object",
    "is_array",
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
    `max_decoded_bytes` and `max_decode_ratio` bound the memory of a load: the file's bytes, what
    decoding its JSON builds (counted as it is built, see bounded_json.py) and, for a trace, its
    tensor data stay under `max_decode_ratio` times the file's size (files under 64 KiB count as
    64 KiB) and under `max_decoded_bytes`; a file that would pass either is refused with
    FileLimitError before the allocation that would pass it (real files take 1.5-3 times their size).
    """

    max_file_bytes: int = 512 * 1024 * 1024
    max_depth: int = 128
    max_string_chars: int = 4 * 1024 * 1024
    max_header_bytes: int = 256 * 1024 * 1024
    max_tensors: int = 1_000_000
    max_dims: int = 64
    max_decoded_bytes: int = 2 * 1024 * 1024 * 1024
    max_decode_ratio: int = 4

    def __post_init__(self) -> None:
        for name in ("max_file_bytes", "max_depth", "max_string_chars", "max_header_bytes", "max_tensors",
                     "max_dims", "max_decoded_bytes", "max_decode_ratio"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"FileLimits.{name} must be a positive int, got {value!r}")


# --- reading and writing bytes ----------------------------------------------------------------


def read_bounded(path: str | os.PathLike, limits: FileLimits, what: str, *, writable: bool = False) -> bytes:
    """The bytes of `path`, refusing (before reading) a file larger than `limits.max_file_bytes`.

    `writable`: a bytearray, for tensors that are views of the file's bytes (load_trace).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > limits.max_file_bytes:
                raise FileLimitError(f"{path}: the {what} file is {size} bytes, over the limit of "
                                     f"{limits.max_file_bytes}; pass limits=FileLimits(max_file_bytes=...) "
                                     "if you trust it")
            if writable:
                data = bytearray(size)
                view, filled = memoryview(data), 0
                while filled < size:
                    got = handle.readinto(view[filled:])
                    if not got:
                        raise MalformedFileError(f"{path}: the {what} file shrank while it was read; read it again "
                                                 "once it is complete")
                    filled += got
                view.release()
            else:
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


# --- strict JSON ---------------------------------------------------------------------------

SMALL_FILE_BYTES = 64 * 1024  # a smaller file may still take max_decode_ratio times this (256 KiB)


def decode_budget(size: int, limits: FileLimits, source: str, held: int = 0, *, unbounded: bool = False) -> DecodeBudget:
    """The memory a load of a `size`-byte file may take, with the `held` bytes it keeps charged at once.

    `held` is what the load holds besides what it decodes: the file's own bytes (released once they
    are dropped) and a trace's tensor data (copied once when its tensors are built). The total
    stays under `limits.max_decode_ratio` times the file (a file under SMALL_FILE_BYTES counts as
    64 KiB) and under `limits.max_decoded_bytes` (`unbounded`: that one only, for a document that
    comes from no file); past it, FileLimitError names the limit and the fix.
    """
    ratio_limit = limits.max_decode_ratio * max(size, SMALL_FILE_BYTES)
    by_bytes = unbounded or limits.max_decoded_bytes <= ratio_limit
    limit = limits.max_decoded_bytes if by_bytes else ratio_limit

    def refuse(used: int, what: str) -> FileLimitError:
        if by_bytes:
            return FileLimitError(f"{source}: loading these {size} bytes takes more than {limits.max_decoded_bytes} "
                                  f"bytes (at {what}), over the limit FileLimits.max_decoded_bytes="
                                  f"{limits.max_decoded_bytes}; the file is refused before it is decoded further. Pass "
                                  "limits=FileLimits(max_decoded_bytes=...) if you trust it")
        return FileLimitError(f"{source}: decoding these {size} bytes takes more than {limit} bytes (at {what}), over "
                              f"{limits.max_decode_ratio} times the text (FileLimits.max_decode_ratio="
                              f"{limits.max_decode_ratio}): the file is dense with tiny values, containers or unique "
                              "keys, as a memory bomb is, and is refused before it is decoded further. Pass "
                              "limits=FileLimits(max_decode_ratio=...) if you trust it")

    budget = DecodeBudget(limit, refuse)
    budget.charge(held, "the file's bytes")
    return budget


def object_bytes(obj: Any) -> int:
    """What one decoded object takes: itself and its attributes' storage (what a decoder charges for it).

    The attributes are counted from the class's dataclass fields, never by reading `__dict__` (which
    would build the dict CPython otherwise leaves out).
    """
    return sys.getsizeof(obj) + 8 * len(field_names(type(obj))) + 64


_FIELDS: dict[type, tuple[str, ...]] = {}


def field_names(cls: type) -> tuple[str, ...]:
    """The dataclass fields of `cls` (an empty tuple for another class), cached per class."""
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = tuple(f.name for f in fields(cls)) if is_dataclass(cls) else ()
    return names


def parse_json(data: bytes | str, limits: FileLimits, source: str, budget: Optional[DecodeBudget] = None, *,
               start: int = 0, end: Optional[int] = None) -> Any:
    """Decode the UTF-8 JSON `data[start:end]` (read in place) strictly into a compact document.

    The document's objects are JSONObjects and its arrays tuples (bounded_json.py); every allocation
    is charged to `budget` (by default: the text's size is held, the rest of `decode_budget` spent).
    Every refusal is a typed SchemaFormatError naming `source`.
    """
    end = len(data) if end is None else end
    if end - start > limits.max_file_bytes:
        raise FileLimitError(f"{source}: {end - start} bytes of JSON, over the limit of {limits.max_file_bytes}")
    if budget is None:
        budget = decode_budget(end - start, limits, source, held=len(data))
    try:
        return decode_bounded(data, budget, source, malformed=MalformedFileError, limit_error=FileLimitError,
                              max_depth=limits.max_depth, max_string_chars=limits.max_string_chars, start=start,
                              end=end)
    except MemoryError:
        raise FileLimitError(f"{source}: decoding {len(data)} bytes of JSON ran out of memory; the file is refused "
                             "(lower FileLimits.max_decoded_bytes to refuse such files sooner)") from None


def check_header(document: Any, format_name: str, version: int, source: str,
                 old_versions: Optional[dict[int, str]] = None, fix: str = "") -> dict:
    """The top-level object of a file of `format_name`: refuses other formats and other versions.

    `old_versions` says, for an older version, what it wrote differently; the refusal of such a
    file names that and `fix` (how to get a file of this version)."""
    if not is_object(document):
        raise MalformedFileError(f"{source}: the top level must be a JSON object, got {_kind(document)}")
    found = document.get("format")
    if found != format_name:
        raise FormatVersionError(f"{source}: this is not a {format_name} file (its \"format\" is "
                                 f"{_short(found)}); write it with the matching save function")
    got = document.get("version")
    if type(got) is not int:
        raise MalformedFileError(f"{source}: \"version\" must be an integer, got {_short(got)}")
    if got != version and old_versions and got in old_versions:
        raise FormatVersionError(f"{source}: format version {got} is an older {format_name} file, and this release "
                                 f"reads version {version} only: {old_versions[got]}. To fix it, {fix}")
    if got != version:
        newer = "a newer" if got > version else "an older"
        raise FormatVersionError(f"{source}: format version {got} comes from {newer} nnschemaparser; this release "
                                 f"reads version {version} only. Re-save the file with this release, or upgrade")
    return document


# --- records ----------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    return {dict: "an object", JSONObject: "an object", tuple: "an array", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else _kind(value)
    return text if len(text) <= 60 else text[:57] + "..."


def record(value: Any, where: str, required: Iterable[str], optional: Iterable[str] = ()) -> dict:
    """`value` as an object with exactly the `required` fields and some of the `optional` ones."""
    if not is_object(value):
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
    if not is_array(value):
        raise MalformedFileError(f"{where}.{key}: expected an array, got {_kind(value)}")
    return value


def get_dict(obj: dict, key: str, where: str) -> dict:
    value = obj[key]
    if not is_object(value):
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
