"""The trace-file half of the hostile corpus: lies in the safetensors header and in the trace metadata.

`trace_mutations(label, data, rng)` derives refused files from one valid trace file: header lengths
that do not fit, headers that are not strict JSON, unknown dtypes, shapes whose byte count does not
match their range (allocation bombs included), ranges that overlap, leave gaps or run past the end,
metadata of another format or version, steps that disagree with their tensors, and references to
code where only plain values may be. Used by hostile_corpus.build_corpus.
"""

from __future__ import annotations

import copy
import json
import random
import struct
from typing import Any, Callable, Optional

from nnschemaparser.schema.errors import SchemaFormatError
from nnschemaparser.files.file_format import FileLimitError, FileLimits, FormatVersionError, MalformedFileError

__all__ = ["trace_mutations"]


def _split(data: bytes) -> tuple[dict, bytes]:
    size = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + size]), data[8 + size:]


def _join(header: Any, body: bytes, raw: Optional[bytes] = None) -> bytes:
    text = raw if raw is not None else json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text + body


def trace_mutations(label: str, data: bytes, rng: random.Random) -> list[tuple[str, bytes, type, Optional[FileLimits]]]:
    """(name, file bytes, expected error, limits or None) for each mutation of the trace file `data`."""
    out: list[tuple[str, bytes, type, Optional[FileLimits]]] = []
    header, body = _split(data)
    meta = json.loads(header["__metadata__"]["trace"])
    keys = [k for k in header if k != "__metadata__"]

    def add(name: str, payload: bytes, error: type = SchemaFormatError, limits: Optional[FileLimits] = None) -> None:
        out.append((f"trace-{label}-{name}", payload, error, limits))

    def with_header(mutate: Callable[[dict], None]) -> bytes:
        h = copy.deepcopy(header)
        mutate(h)
        return _join(h, body)

    def with_meta(mutate: Callable[[dict], None]) -> bytes:
        doc = copy.deepcopy(meta)
        mutate(doc)
        h = copy.deepcopy(header)
        h["__metadata__"]["trace"] = json.dumps(doc)
        return _join(h, body)

    key = keys[len(keys) // 2]
    # header length and framing
    add("header-length-past-end", struct.pack("<Q", len(data)) + data[8:], MalformedFileError)
    add("header-length-huge", struct.pack("<Q", 2 ** 64 - 1) + data[8:], FileLimitError)
    add("header-length-zero", struct.pack("<Q", 0) + data[8:], MalformedFileError)
    add("header-over-limit", data, FileLimitError, limits=FileLimits(max_header_bytes=64))
    add("file-over-limit", data, FileLimitError, limits=FileLimits(max_file_bytes=100))
    add("four-bytes", data[:4], MalformedFileError)
    add("empty", b"", MalformedFileError)
    for index, cut in enumerate(sorted({int(len(data) * k / 13) for k in range(1, 13)} | {len(data) - 1})):
        add(f"truncated-{index}", data[:cut], MalformedFileError)
    # header JSON
    add("header-not-json", _join(None, body, b"{not json}"), MalformedFileError)
    add("header-array", _join([], body), MalformedFileError)
    raw = json.dumps(header, separators=(",", ":"))
    add("header-duplicate-key", _join(None, body, raw.replace("{", '{"__metadata__":{},', 1).encode()),
        MalformedFileError)
    add("header-nan", _join(None, body, raw.replace('"data_offsets":[', '"data_offsets":[NaN,', 1).encode()),
        MalformedFileError)
    add("header-depth-bomb", _join(None, body, b"[" * 50_000 + b"]" * 50_000), FileLimitError)
    add("no-metadata", with_header(lambda h: h.pop("__metadata__")), FormatVersionError)
    add("metadata-not-object", with_header(lambda h: h.__setitem__("__metadata__", "x")), FormatVersionError)
    add("metadata-extra-key", with_header(lambda h: h["__metadata__"].__setitem__("exec", "x")), MalformedFileError)
    add("metadata-value-not-string", with_header(lambda h: h["__metadata__"].__setitem__("version", 1)),
        MalformedFileError)
    add("metadata-format", with_header(lambda h: h["__metadata__"].__setitem__("format", "pickle")),
        FormatVersionError)
    add("metadata-version", with_header(lambda h: h["__metadata__"].__setitem__("version", "2")), FormatVersionError)
    add("metadata-trace-not-json", with_header(lambda h: h["__metadata__"].__setitem__("trace", "{")),
        MalformedFileError)
    add("metadata-trace-nan", with_header(lambda h: h["__metadata__"].__setitem__(
        "trace", h["__metadata__"]["trace"].replace('"frame_depth":0', '"frame_depth":NaN', 1))), MalformedFileError)
    # tensor entries
    for index, dtype in enumerate(["PICKLE", "F128", "object", 3, "f32", "C128"]):
        add(f"dtype-{index}", with_header(lambda h, d=dtype: h[key].__setitem__("dtype", d)), MalformedFileError)
    for index, shape in enumerate([[-1], [2 ** 31, 2 ** 31], [1.5], "4", [2] * 70, [2 ** 62, 0, 2 ** 62]]):
        add(f"shape-{index}", with_header(lambda h, s=shape: h[key].__setitem__("shape", s)), MalformedFileError)
    begin, end = header[key]["data_offsets"]
    for index, offsets in enumerate([[begin, end + 4], [end, begin], [0, len(body) + 8], [-4, end], [begin],
                                     [str(begin), end], [begin + 1, end + 1], [begin, 2 ** 70]]):
        add(f"offsets-{index}", with_header(lambda h, o=offsets: h[key].__setitem__("data_offsets", o)),
            MalformedFileError)
    add("offsets-missing", with_header(lambda h: h[key].pop("data_offsets")), MalformedFileError)
    add("entry-extra-field", with_header(lambda h: h[key].__setitem__("pickle", "x")), MalformedFileError)
    add("trailing-bytes", _join(header, body + b"\0" * 16), MalformedFileError)
    add("missing-bytes", _join(header, body[:-8]), MalformedFileError)
    add("too-many-tensors", data, FileLimitError, limits=FileLimits(max_tensors=1))
    add("allocation-bomb", with_header(lambda h: h[key].update(dtype="F64", shape=[2 ** 20, 2 ** 20])),
        MalformedFileError)
    # the trace document
    add("trace-kind", with_meta(lambda d: d.__setitem__("kind", "exec")), MalformedFileError)
    add("trace-version", with_meta(lambda d: d.__setitem__("version", 2)), FormatVersionError)
    add("trace-unknown-field", with_meta(lambda d: d.__setitem__("code", "x")), MalformedFileError)
    add("trace-missing-steps", with_meta(lambda d: d.pop("steps")), MalformedFileError)
    step_index = rng.randrange(len(meta["steps"]))
    used_keys = [s["tensor"]["tensor_key"] for s in meta["steps"]]
    tensor_steps = [i for i, key in enumerate(used_keys) if key and used_keys.count(key) == 1]
    t_index = rng.choice(tensor_steps)
    add("step-unknown-field", with_meta(lambda d: d["steps"][step_index].__setitem__("exec", 1)), MalformedFileError)
    add("step-missing-field", with_meta(lambda d: d["steps"][step_index].pop("description")), MalformedFileError)
    add("step-mistyped", with_meta(lambda d: d["steps"][step_index].__setitem__("step", "1")), MalformedFileError)
    add("step-edited-mistyped", with_meta(lambda d: d["steps"][step_index].__setitem__("edited", 1)),
        MalformedFileError)
    add("tensor-key-unknown", with_meta(lambda d: d["steps"][t_index]["tensor"].__setitem__("tensor_key", "nope")),
        MalformedFileError)
    add("tensor-key-and-value", with_meta(lambda d: d["steps"][t_index]["tensor"].__setitem__("value", 1)),
        MalformedFileError)
    add("tensor-shape-lie", with_meta(lambda d: d["steps"][t_index]["tensor"].__setitem__("shape", [99])),
        MalformedFileError)
    add("tensor-dtype-lie", with_meta(lambda d: d["steps"][t_index]["tensor"].__setitem__("dtype", "torch.int8")),
        MalformedFileError)
    add("tensor-unreferenced", with_meta(lambda d: d["steps"][t_index]["tensor"].__setitem__("tensor_key", None)),
        MalformedFileError)
    for index, value in enumerate([{"kind": "callable", "name": "builtins.eval"},
                                   {"kind": "global", "namespace": "os", "name": "system", "type": "function",
                                    "qualname": "hostile_corpus.touch_canary"},
                                   {"kind": "pickle", "data": "x"}, {"kind": "float", "value": "1e999"}]):
        add(f"sample-value-{index}", with_meta(lambda d, v=value: d["steps"][step_index].__setitem__("sample", [v])),
            SchemaFormatError)
    add("value-callable", with_meta(lambda d: d["steps"][step_index]["tensor"].update(
        tensor_key=None, value={"kind": "callable", "name": "torch.load"})), SchemaFormatError)
    return out
