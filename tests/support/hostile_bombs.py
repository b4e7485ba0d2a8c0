"""Memory bombs for the hostile corpus: small files that would decode into huge Python structures.

`schema_bombs(base, canary)` and `trace_bombs(label, data)` give (name, file bytes, expected error,
limits) for every JSON container kind — arrays, objects, the tagged containers of the value codec
(tuple, dict, set, frozenset, size), short strings, numbers, unique keys, nested empties — placed
where a real file has a value, and for every JSON text of a trace file (the safetensors header, its
metadata, the trace document inside it). Each bomb is `BOMB_BYTES` long; each is refused with a
typed error (never MemoryError) within FileLimits.max_decode_ratio (4) times its size.

The decoder (nnschemaparser/files/bounded_json.py) shares identical containers, so a bomb of
*identical* containers (nested empty arrays, tagged values) decodes to one object and a table of
pointers: as a bare document or a header entry it is small and refused by the record checks
(MalformedFileError); where a value is expected its decoded values are charged one by one and it is
refused by the memory budget (FileLimitError). A *dense* bomb (empty containers, zeros, floats,
short strings, unique keys) cannot be decoded within the budget anywhere: FileLimitError.
"""

from __future__ import annotations

import copy
import json
import struct
from typing import Any, Optional

from nnschemaparser.files.file_format import FileLimitError, FileLimits, MalformedFileError

__all__ = ["BOMB_BYTES", "schema_bombs", "trace_bombs", "PAYLOADS", "BUILDERS"]

BOMB_BYTES = 256 * 1024  # past the 64 KiB under which a file counts as 64 KiB: the ratio is the bound


def _repeat(item: bytes, size: int, open_: bytes = b"[", close: bytes = b"]") -> bytes:
    count = max(1, (size - len(open_) - len(close)) // (len(item) + 1))
    return open_ + b",".join([item] * count) + close


def _unique_keys(size: int) -> bytes:
    parts, total, index = [], 2, 0
    while total < size:
        part = b'"k%d":0' % index
        parts.append(part)
        total += len(part) + 1
        index += 1
    return b"{" + b",".join(parts) + b"}"


def _tagged(kind: str, size: int) -> bytes:
    item = json.dumps({"kind": kind, "items": []}, separators=(",", ":")).encode()
    return _repeat(item, size)


# name -> (builder of a JSON text of about `size` bytes, dense: no position decodes it within the budget)
BUILDERS = {
    "empty-arrays": (lambda size: _repeat(b"[]", size), True),
    "empty-objects": (lambda size: _repeat(b"{}", size), True),
    "nested-empty-arrays": (lambda size: _repeat(b"[[[[]]]]", size), False),
    "one-key-objects": (lambda size: _repeat(b'{"a":0}', size), True),
    "zeros": (lambda size: _repeat(b"0", size), True),
    "tagged-tuples": (lambda size: _tagged("tuple", size), False),
    "tagged-sets": (lambda size: _tagged("set", size), False),
    "tagged-frozensets": (lambda size: _tagged("frozenset", size), False),
    "tagged-dicts": (lambda size: _tagged("dict", size), False),
    "tagged-sizes": (lambda size: _tagged("size", size), False),
    "short-strings": (lambda size: _repeat(b'"ab"', size), True),
    "floats": (lambda size: _repeat(b"1e1", size), True),
    "unique-keys": (_unique_keys, True),
}
PAYLOADS: dict[str, tuple[bytes, bool]] = {name: (build(BOMB_BYTES), dense) for name, (build, dense) in BUILDERS.items()}


def _splice(document: dict, payload: bytes) -> bytes:
    """`document` as JSON with `payload` as the first argument of its first call."""
    marker = "__BOMB_HERE__"
    doc = copy.deepcopy(document)
    op = next(i for i in doc["root"]["signature"]["body"] if i["type"] == "op" and i["args"])
    op["args"][0] = marker
    text = json.dumps(doc, separators=(",", ":")).encode()
    return text.replace(json.dumps(marker).encode(), payload, 1)


def schema_bombs(base: dict) -> list[tuple[str, bytes, type, Optional[FileLimits], bool]]:
    """(name, bytes, expected error, limits, refused by the memory budget) of every schema bomb."""
    out = []
    for name, (payload, dense) in PAYLOADS.items():
        out.append((f"bomb-{name}", _splice(base, payload), FileLimitError, None, True))  # its values are charged
        out.append((f"bomb-bare-{name}", payload, FileLimitError if dense else MalformedFileError, None, dense))
    return out


def _split(data: bytes) -> tuple[dict, bytes]:
    size = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + size]), data[8 + size:]


def _frame(header_text: bytes, body: bytes) -> bytes:
    return struct.pack("<Q", len(header_text)) + header_text + body


def trace_bombs(label: str, data: bytes) -> list[tuple[str, bytes, type, Optional[FileLimits], bool]]:
    header, body = _split(data)
    out = []
    for name, (payload, dense) in PAYLOADS.items():
        # an extra header entry: what safetensors' own parser would build
        text = json.dumps(header, separators=(",", ":")).encode()
        out.append((f"trace-{label}-header-bomb-{name}", _frame(text[:-1] + b',"bomb":' + payload + b"}", body),
                    FileLimitError if dense else MalformedFileError, None, dense))
        # inside the trace document of the metadata (a JSON string inside the header)
        meta = json.loads(header["__metadata__"]["trace"])
        meta["steps"][0]["sample"] = ["__BOMB_HERE__"]
        inner = json.dumps(meta, separators=(",", ":")).replace('"__BOMB_HERE__"', payload.decode())
        h = copy.deepcopy(header)
        h["__metadata__"]["trace"] = inner
        out.append((f"trace-{label}-metadata-bomb-{name}", _frame(json.dumps(h, separators=(",", ":")).encode(), body),
                    FileLimitError, None, True))  # a sample's values are charged
    return out
