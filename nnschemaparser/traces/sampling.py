"""Bounded samples of tensors: the quotas (`CaptureLimits`) and what one sample is (`TensorSnapshot`).

`sample_tensor` is the one place that decides which tensors can be sampled and copies a short,
detached prefix of values; the hook-based `capture_model` (inspection) and the schema interpreter's
bounded capture (`ActivationRecorder(limits=...)`) both use it, so both agree on what a sample is.

Depends on torch and the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

__all__ = ["CaptureLimits", "TensorSnapshot", "sample_tensor", "tensor_shape"]


LIMIT_POLICIES = ("earliest", "latest")  # what ActivationRecorder(limit_policy=...) keeps past its limits
EVICTED = "evicted by later values"
# How the `omitted` text of a value the limits dropped begins (ActivationTrace.dropped reads it)
LIMIT_REASONS = ("max_tensors quota", "max_bytes quota", EVICTED)


@dataclass(frozen=True)
class CaptureLimits:
    """Positive quotas for one `ModelCapture`.

    ``max_tensors`` and ``max_bytes`` are shared by everything one capture instance records, across
    all forward calls and all entrances of its context. ``max_traversal_nodes`` and
    ``max_container_depth`` start afresh for every walk: once over the combined positional and
    keyword inputs of a call, and once over its output. None of them bounds the model, its tensors
    or Python's own overhead for the records.

    Attributes:
        max_tensors: Snapshots kept by the capture, counting metadata-only and empty tensors.
        max_samples_per_tensor: Leading elements (row-major) copied from one tensor.
        max_bytes: Source-dtype bytes copied into samples by the capture, all snapshots together.
        max_traversal_nodes: Containers, tensors and other leaves visited by one walk.
        max_container_depth: Container edges followed from ``args``/``kwargs``/``output``.
    """

    max_tensors: int = 64
    max_samples_per_tensor: int = 32
    max_bytes: int = 16 * 1024
    max_traversal_nodes: int = 4096
    max_container_depth: int = 32

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            # bool is an int subclass, but True as a quota is almost certainly a mistake.
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"CaptureLimits.{field.name} must be a positive int, got {value!r}; "
                    f"use a whole number of at least 1 (default {field.default})."
                )


@dataclass(frozen=True)
class TensorSnapshot:
    """One tensor seen by a capture hook: its full description and a bounded copy of its values.

    Everything except ``values`` describes the whole source tensor as it was when the hook ran.
    ``values`` holds Python scalars copied from the first elements in row-major order, so the
    record shares no storage with the source and keeps no autograd history alive.

    Attributes:
        module_path: Registered path of the module, ``"<root>"`` for the model itself.
        call_index: Zero-based count of earlier calls of that module seen by this capture; the
            input and output snapshots of one call carry the same index.
        direction: ``"input"`` (seen before forward) or ``"output"`` (seen after it).
        tensor_path: Where the tensor sat, e.g. ``args[0]``, ``kwargs['mask']``, ``output[1]['x']``.
        shape: Full shape of the source; a ragged dimension of a nested tensor is ``-1``.
        dtype: ``str`` of the source dtype, e.g. ``"torch.float32"``.
        device: ``str`` of the source device, e.g. ``"cuda:0"``.
        numel: Number of elements in the whole source tensor.
        sampled_bytes: Source-dtype bytes represented by ``values``.
        values: Leading elements as Python ``float``/``int``/``bool``; possibly fewer than ``numel``.
        sample_omission_reason: Why values were not read at all (complex, meta, sparse or other
            non-strided layout, quantized...); ``None`` when sampling is supported, including for
            empty tensors.
    """

    module_path: str
    call_index: int
    direction: str
    tensor_path: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    numel: int
    sampled_bytes: int
    values: tuple[Any, ...]
    sample_omission_reason: str | None = None


def _dtypes(*names: str) -> frozenset[torch.dtype]:
    # Older torch builds lack some of these dtypes; only keep the ones this build has.
    return frozenset(getattr(torch, name) for name in names if hasattr(torch, name))


# Dtypes whose elements `Tensor.tolist` turns into Python scalars. Quantized, complex, bit-packed
# and sub-byte dtypes are left out on purpose.
_SAMPLEABLE_DTYPES = _dtypes(
    "bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
    "float16", "bfloat16", "float32", "float64",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
)

# Integer dtype of each element size, used to gather a strided prefix with well-supported kernels.
_GATHER_DTYPE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _omission_reason(tensor: torch.Tensor) -> str | None:
    """Say why `tensor` cannot be sampled without conversion, or None when it can."""
    if tensor.is_meta:
        return "meta tensor: it has no data"
    if tensor.layout != torch.strided:
        return f"layout {tensor.layout} is not strided; values are not densified"
    if tensor.is_nested:
        return "nested tensor: no single row-major order"
    if tensor.is_quantized:
        return f"quantized dtype {tensor.dtype}; values are not dequantized"
    if tensor.is_complex():
        return f"complex dtype {tensor.dtype}; values are not split or cast"
    if tensor.dtype not in _SAMPLEABLE_DTYPES:
        return f"dtype {tensor.dtype} has no Python scalar form"
    return None


def sample_tensor(
    tensor: torch.Tensor, max_samples: int, bytes_left: int
) -> tuple[tuple[Any, ...], int, str | None]:
    """Copy at most `max_samples` leading elements of `tensor`, spending at most `bytes_left` bytes.

    Elements are taken in row-major order of the full tensor, whatever its strides, and returned as
    Python scalars on the CPU. Only the copied prefix is gathered, never the whole tensor.

    Returns:
        ``(values, sampled_bytes, omission_reason)``. Tensors that cannot be sampled without a
        conversion (see `TensorSnapshot.sample_omission_reason`) give ``((), 0, reason)`` and are
        never read. Empty tensors give ``((), 0, None)``. Fewer values than
        ``min(numel, max_samples)`` with no reason means `bytes_left` ran out.
    """
    if max_samples < 0 or bytes_left < 0:
        raise ValueError(
            f"sample_tensor needs non-negative quotas, got max_samples={max_samples}, "
            f"bytes_left={bytes_left}."
        )
    reason = _omission_reason(tensor)
    if reason is not None:
        return (), 0, reason
    item_size = tensor.element_size()
    count = min(tensor.numel(), max_samples, bytes_left // item_size)
    if count == 0:
        return (), 0, None
    with torch.no_grad():
        prefix = _row_major_prefix(tensor.detach(), count)
        values = tuple(prefix.cpu().tolist())
    return values, count * item_size, None


def _row_major_prefix(tensor: torch.Tensor, count: int) -> torch.Tensor:
    """Return the first `count` row-major elements of a non-empty strided tensor as a 1-D tensor."""
    if tensor.dim() == 0:
        return tensor.reshape(1)
    if tensor.is_contiguous():
        return tensor.view(-1)[:count]
    # Gathering through an integer view of the same width works for every sampleable dtype, even
    # where a device has no indexing kernel for, say, float8.
    source = tensor.view(_GATHER_DTYPE[tensor.element_size()])
    flat = torch.arange(count, device=tensor.device)
    coords = []
    for size in reversed(tensor.shape):
        coords.append(flat % size)
        flat = flat // size
    return source[tuple(reversed(coords))].view(tensor.dtype)


def tensor_shape(tensor: torch.Tensor) -> tuple[int, ...]:
    if not tensor.is_nested:
        return tuple(int(size) for size in tensor.shape)
    shape = []
    for dim in range(tensor.dim()):
        # A ragged dimension has no single size: strided nested tensors raise, jagged ones answer
        # with a symbolic nested int. Both are recorded as -1.
        try:
            size = tensor.size(dim)
        except RuntimeError:
            size = -1
        shape.append(size if type(size) is int else -1)
    return tuple(shape)


