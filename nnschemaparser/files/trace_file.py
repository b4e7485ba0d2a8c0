"""save_trace / load_trace: an activation or gradient trace as one safetensors file.

The tensor values are the safetensors tensors, keyed by container id; the step metadata is a JSON
document (docs/FORMAT.md) stored as a string in the safetensors header's `__metadata__`. Loading
reads at most `FileLimits.max_file_bytes`, then checks the whole header itself (safetensors is used
to write, never to read): the header length fits the file, every tensor's dtype is known, its byte
range matches its shape and the ranges tile the data exactly, and every step agrees with the tensor
it names. Only then are the tensors materialised, as views of the file's own bytes (no copy), so a
loaded trace holds the file once. The header and the trace document in its metadata are decoded by
bounded_json under the file's memory budget (FileLimits.max_decode_ratio times its size).

Depends on traces, schema, value_codec, file_format and safetensors; never on the runtime or views.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any, Optional

import torch

from ..schema.errors import SchemaFormatError
from .file_format import (
    FileLimitError,
    FileLimits,
    FormatVersionError,
    MalformedFileError,
    check_header,
    decode_budget,
    dump_json,
    get_bool,
    get_int,
    get_list,
    get_opt_str,
    get_str,
    is_array,
    is_object,
    object_bytes,
    parse_json,
    read_bounded,
    record,
    write_atomic,
)
from ..schema.model import TensorContainer
from ..traces.trace import ActivationTrace, GradientTrace, TraceStep
from .value_codec import ValueDecoder, ValueEncoder

__all__ = ["save_trace", "load_trace", "FORMAT_NAME", "FORMAT_VERSION", "SAFETENSORS_DTYPES"]

FORMAT_NAME = "nnschemaparser-trace"
FORMAT_VERSION = 1
_METADATA_KEYS = ("format", "version", "trace")
_STEP_FIELDS = ("step", "container_id", "description", "slot_type", "out_var", "op_name", "block_path",
                "source_container_id", "frame_depth", "omitted", "sample", "edited", "tensor")
_TENSOR_FIELDS = ("shape", "dtype", "container_id", "slot_type", "tensor_key", "value")
_KINDS = {"activation": ActivationTrace, "gradient": GradientTrace}

# safetensors dtype code -> (torch dtype, bytes per element)
SAFETENSORS_DTYPES: dict[str, tuple[torch.dtype, int]] = {
    code: (dtype, dtype.itemsize) for code, dtype in {
        "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
        "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
        "BOOL": torch.bool, "C64": torch.complex64, "U64": getattr(torch, "uint64", None),
        "U32": getattr(torch, "uint32", None), "U16": getattr(torch, "uint16", None),
        "F8_E4M3": getattr(torch, "float8_e4m3fn", None), "F8_E5M2": getattr(torch, "float8_e5m2", None),
    }.items() if dtype is not None
}
_CODES = {dtype: code for code, (dtype, _) in SAFETENSORS_DTYPES.items()}


def _safetensors() -> Any:
    try:
        import safetensors.torch as st
    except ImportError:  # pragma: no cover - a declared dependency of the file formats
        raise ImportError("save_trace / load_trace need the safetensors package: pip install safetensors") from None
    return st


# --- saving -----------------------------------------------------------------------------------


def _storable(value: torch.Tensor, where: str) -> torch.Tensor:
    tensor = value.detach()
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_meta or tensor.is_nested:
        raise SchemaFormatError(f"cannot save {where}: a {tensor.layout} / quantized / meta / nested tensor has no "
                                "safetensors form; keep dense tensors in traces")
    if tensor.dtype not in _CODES:
        raise SchemaFormatError(f"cannot save {where}: safetensors has no {tensor.dtype}; supported: "
                                f"{', '.join(str(d) for d in _CODES)}")
    return tensor.to("cpu").resolve_conj().resolve_neg().contiguous()


def save_trace(trace: ActivationTrace | GradientTrace, path: str | os.PathLike) -> Path:
    """Write `trace` to `path` (a safetensors file whose metadata is the trace's JSON); returns the path.

    Tensor values come back on the CPU, detached, bit for bit; a tensor held by several steps is
    written once and shared again on load.
    """
    kind = next((name for name, cls in _KINDS.items() if type(trace) is cls), None)
    if kind is None:
        raise SchemaFormatError(f"save_trace needs an ActivationTrace or a GradientTrace, got {type(trace).__name__}")
    encoder = ValueEncoder(allow_globals=False)
    tensors: dict[str, torch.Tensor] = {}
    keys_by_id: dict[int, str] = {}
    storages: set[int] = set()
    steps = []
    for index, step in enumerate(trace.steps):
        where = f"step {step.step} ({step.container_id})"
        container = step.tensor
        value, key = container.value, None
        if isinstance(value, torch.Tensor):
            key = keys_by_id.get(id(value))
            if key is None:
                key = step.container_id if step.container_id not in tensors else f"{step.container_id}#{index}"
                tensor = _storable(value, where)
                pointer = tensor.untyped_storage().data_ptr() if tensor.numel() else 0
                if pointer in storages:
                    tensor = tensor.clone()  # safetensors refuses tensors that share memory
                elif pointer:
                    storages.add(pointer)
                tensors[key] = tensor
                keys_by_id[id(value)] = key
            value = None
        steps.append({
            "step": step.step, "container_id": step.container_id, "description": step.description,
            "slot_type": step.slot_type, "out_var": step.out_var, "op_name": step.op_name,
            "block_path": step.block_path, "source_container_id": step.source_container_id,
            "frame_depth": step.frame_depth, "omitted": step.omitted,
            "sample": [encoder.value(item, where) for item in step.sample], "edited": bool(step.edited),
            "tensor": {"shape": [int(d) for d in container.shape], "dtype": str(container.dtype),
                       "container_id": container.container_id, "slot_type": container.slot_type,
                       "tensor_key": key, "value": encoder.value(value, where)},
        })
    document = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "kind": kind, "root": trace.root, "steps": steps}
    text = dump_json(document).decode("ascii")
    metadata = {"format": FORMAT_NAME, "version": str(FORMAT_VERSION), "trace": text}
    return write_atomic(path, _safetensors().save(tensors, metadata=metadata))


# --- loading ----------------------------------------------------------------------------------


def _read_header(data: bytes, limits: FileLimits, source: str) -> tuple[dict, dict[str, tuple], Any]:
    """The safetensors header, checked entry by entry; returns (metadata, {key: (dtype, shape)}, budget).

    The budget (file_format.decode_budget) holds the file's bytes and its tensor data (copied once
    when the tensors are built); the header, the trace document in its metadata and the steps built
    from it share what is left.
    """
    if len(data) < 8:
        raise MalformedFileError(f"{source}: {len(data)} bytes is too short for a trace file (truncated?)")
    size = int.from_bytes(data[:8], "little")
    if size > limits.max_header_bytes:
        raise FileLimitError(f"{source}: the header claims {size} bytes, over the limit of {limits.max_header_bytes}")
    if 8 + size > len(data):
        raise MalformedFileError(f"{source}: the header claims {size} bytes but only {len(data) - 8} follow its length "
                                 "(a truncated file?)")
    budget = decode_budget(len(data), limits, source, held=len(data))  # the bytes; the tensors are views of them
    header = parse_json(data, limits, f"{source} (header)", budget, start=8, end=8 + size)  # read in place
    if not is_object(header):
        raise MalformedFileError(f"{source}: the safetensors header is not a JSON object")
    metadata = header.get("__metadata__")
    if not is_object(metadata):
        raise FormatVersionError(f"{source}: no nnschemaparser metadata in this safetensors file; write traces with "
                                 "save_trace")
    record(metadata, f"{source}: __metadata__", _METADATA_KEYS)
    layout = safetensors_layout(header, 8 + size, len(data) - 8 - size, limits, source)
    return metadata, layout, budget


def safetensors_layout(header: dict, data_start: int, available: int, limits: FileLimits,
                       source: str) -> dict[str, tuple[torch.dtype, tuple, int]]:
    """The checked layout of a safetensors header's tensors (every key but `__metadata__`): {key: (dtype,
    shape, offset of its first byte in the file)}, for a file whose data starts at `data_start` and holds
    `available` bytes. Checks, for trace files and store shards alike: at most `limits.max_tensors`
    entries, each an exact record of a known dtype, a shape of at most `limits.max_dims` non-negative
    dimensions whose contiguous strides fit 64 bits (zero-sized tensors too), and a byte range inside the
    data that matches the shape; the ranges tile the data with no gap or overlap."""
    entries = [(key, entry) for key, entry in header.items() if key != "__metadata__"]
    if len(entries) > limits.max_tensors:
        raise FileLimitError(f"{source}: {len(entries)} tensors, over the limit of {limits.max_tensors}")
    spans, layout = [], {}
    for key, entry in entries:
        where = f"{source}: tensor {key!r}"
        record(entry, where, ("dtype", "shape", "data_offsets"))
        code = entry["dtype"]
        if type(code) is not str or code not in SAFETENSORS_DTYPES:
            raise MalformedFileError(f"{where}: unknown dtype {code!r}")
        dtype, itemsize = SAFETENSORS_DTYPES[code]
        shape = _shape(entry["shape"], f"{where}.shape", limits)
        offsets = entry["data_offsets"]
        if (not is_array(offsets) or len(offsets) != 2 or any(type(o) is not int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise MalformedFileError(f"{where}.data_offsets: expected [begin, end] with 0 <= begin <= end")
        needed = math.prod(shape) * itemsize
        if offsets[1] > available:
            raise MalformedFileError(f"{where}: bytes {offsets[0]}..{offsets[1]} lie past the {available} data bytes "
                                     "of the file (truncated?)")
        if offsets[1] - offsets[0] != needed:
            raise MalformedFileError(f"{where}: shape {shape} of {code} needs {needed} bytes, the file gives "
                                     f"{offsets[1] - offsets[0]}")
        spans.append((offsets[0], offsets[1], key))
        layout[key] = (dtype, tuple(shape), data_start + offsets[0])
    position = 0
    for begin, end, key in sorted(spans):
        if begin != position:
            raise MalformedFileError(f"{source}: tensor {key!r} starts at byte {begin}, expected {position}: tensors "
                                     "must tile the data without gaps or overlaps")
        position = end
    if position != available:
        raise MalformedFileError(f"{source}: the tensors cover {position} of {available} data bytes")
    return layout


def _shape(value: Any, where: str, limits: FileLimits) -> list[int]:
    if not is_array(value) or len(value) > limits.max_dims:
        raise MalformedFileError(f"{where}: expected an array of at most {limits.max_dims} dimensions")
    if any(type(d) is not int or not 0 <= d < 2 ** 62 for d in value):
        raise MalformedFileError(f"{where}: dimensions are non-negative integers")
    # the strides of a contiguous tensor multiply every dim but the first (zero-sized dims too): they must fit
    if math.prod(max(d, 1) for d in value) >= 2 ** 62:
        raise MalformedFileError(f"{where}: the shape {list(value)} is larger than a tensor can be laid out "
                                 "(its strides overflow 64 bits)")
    return value


def load_trace(path: str | os.PathLike, *, limits: Optional[FileLimits] = None) -> ActivationTrace | GradientTrace:
    """Read a trace file written by save_trace; a malformed file raises a SchemaFormatError subclass."""
    limits = limits or FileLimits()
    source = str(path)
    data = read_bounded(path, limits, "trace", writable=True)  # the tensors are views of these bytes
    metadata, layout, budget = _read_header(data, limits, source)
    for key in ("format", "version", "trace"):
        get_str(metadata, key, f"{source}: __metadata__")
    if metadata["format"] != FORMAT_NAME or metadata["version"] != str(FORMAT_VERSION):
        raise FormatVersionError(f"{source}: a {metadata['format']!r} file of version {metadata['version']!r}; this "
                                 f"release reads {FORMAT_NAME} version {FORMAT_VERSION}")
    text = metadata["trace"]
    document = parse_json(text, limits, f"{source} (trace metadata)", budget)
    text_bytes = sys.getsizeof(text)
    del metadata, text  # the document replaces its text (the header's only large string)
    budget.release(text_bytes)
    check_header(document, FORMAT_NAME, FORMAT_VERSION, source)
    record(document, source, ("format", "version", "kind", "root", "steps"))
    kind = get_str(document, "kind", source)
    if kind not in _KINDS:
        raise MalformedFileError(f"{source}.kind: {kind!r} is not 'activation' or 'gradient'")
    steps, used = _decode_steps(get_list(document, "steps", source), layout, limits, source, budget)
    unused = sorted(set(layout) - used)
    if unused:
        raise MalformedFileError(f"{source}: tensor {unused[0]!r} belongs to no step")
    tensors = materialise(data, layout, budget) if layout else {}
    for step, key in steps:
        if key is not None:
            step.tensor.value = tensors[key]
    return _KINDS[kind]([step for step, _ in steps], root=get_str(document, "root", source))


_TENSOR_BYTES = 256  # a tensor object over bytes it does not own, and its storage
_DECODER_BYTES = 8 * 1024


def materialise(data: bytearray, layout: dict[str, tuple], budget: Any) -> dict[str, torch.Tensor]:
    """The tensors of a checked header: views of the file's own bytes, without a copy.

    `layout` maps a key to (dtype, shape, byte offset in `data`), each range checked by _read_header
    (inside the data, tiling it). A tensor whose offset is not a multiple of its element size (a
    file not written by safetensors) or on a big-endian machine is copied instead, and charged.
    """
    tensors = {}
    for key, (dtype, shape, offset) in layout.items():
        count = math.prod(shape)
        budget.charge(_TENSOR_BYTES, "a tensor")
        if count == 0:
            tensors[key] = torch.empty(shape, dtype=dtype)
            continue
        tensor = torch.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)
        if offset % dtype.itemsize or sys.byteorder == "big":
            budget.charge(count * dtype.itemsize, "a tensor copy")
            tensor = tensor.clone() if sys.byteorder == "little" else _swapped(tensor)
        tensors[key] = tensor
    return tensors


def _swapped(tensor: torch.Tensor) -> torch.Tensor:  # pragma: no cover - big-endian machines only
    raw = tensor.contiguous().view(torch.uint8).reshape(-1, tensor.element_size()).flip(1)
    return raw.reshape(-1).view(tensor.dtype).reshape(tensor.shape).clone()


def _decode_steps(items: list, layout: dict, limits: FileLimits, source: str, budget: Any) -> tuple[list, set]:
    decoder = ValueDecoder(None, limits.max_depth, budget)
    budget.charge(_DECODER_BYTES, "the decoder")  # names of entries and other state while it runs
    steps, used = [], set()
    for index, data in enumerate(items):
        where = f"{source}: steps[{index}]"
        record(data, where, _STEP_FIELDS)
        raw = data["tensor"]
        record(raw, f"{where}.tensor", _TENSOR_FIELDS)
        shape = tuple(_shape(raw["shape"], f"{where}.tensor.shape", limits))
        dtype = get_str(raw, "dtype", f"{where}.tensor", max_chars=256)
        key = get_opt_str(raw, "tensor_key", f"{where}.tensor")
        value = decoder.value(raw["value"], f"{where}.tensor.value")
        if key is not None:
            if value is not None:
                raise MalformedFileError(f"{where}.tensor: both a tensor_key and a value")
            if key not in layout:
                raise MalformedFileError(f"{where}.tensor.tensor_key: no tensor {key!r} in the file")
            stored_dtype, stored_shape, _ = layout[key]
            if stored_shape != shape or str(stored_dtype) != dtype:
                raise MalformedFileError(f"{where}.tensor: the step says {dtype}{list(shape)}, the stored tensor is "
                                         f"{stored_dtype}{list(stored_shape)}")
            used.add(key)
        raw_sample = get_list(data, "sample", where)
        sample = tuple(decoder.value(item, f"{where}.sample[{i}]") for i, item in enumerate(raw_sample))
        odd = next((i for i, item in enumerate(sample) if type(item) not in (bool, int, float, complex)), None)
        if odd is not None:
            raise MalformedFileError(f"{where}.sample[{odd}]: a sample element is a number, got "
                                     f"{type(sample[odd]).__name__}")
        container = TensorContainer(shape=shape, dtype=dtype, value=value,
                                    container_id=get_str(raw, "container_id", f"{where}.tensor"),
                                    slot_type=get_str(raw, "slot_type", f"{where}.tensor"))
        step = TraceStep(step=get_int(data, "step", where), container_id=get_str(data, "container_id", where),
                         description=get_str(data, "description", where), slot_type=get_str(data, "slot_type", where),
                         out_var=get_str(data, "out_var", where), op_name=get_str(data, "op_name", where),
                         block_path=get_str(data, "block_path", where), tensor=container,
                         source_container_id=get_opt_str(data, "source_container_id", where),
                         frame_depth=get_int(data, "frame_depth", where), omitted=get_opt_str(data, "omitted", where),
                         sample=sample, edited=get_bool(data, "edited", where))
        budget.charge(object_bytes(step) + object_bytes(container) + sys.getsizeof(sample) + 64, "a step")
        steps.append((step, key))
    budget.release(_DECODER_BYTES)
    return steps, used
