"""diverge's per-row error in C: `_diverge_errors.c`, built with the system C compiler on first use.

The torch path of `diverge_bounds.relative_error` reads a row about six times (x cast to float32, the
difference, `|ref|`, `|ref| + s`, the quotient, and two min-max passes for `s` and the answer). Its
common case (float32 work, a CPU float32 reference and a float32, bfloat16 or float16 value, both
contiguous or views whose last dimension is contiguous, nothing saturated, no NaN) is two passes in C: `s`, then the largest quotient. Each
element is rounded exactly as torch's float32 sub, abs, add and div round it (one IEEE operation
each, no fused multiply-add: runtime/native_build.py's flags), so the answer is the very float the
torch path gives, the sign of a zero answer included; the C code hands everything else back
(`error` is None) and the torch path decides.

No compiler, a failed build or `NNSCHEMAPARSER_NATIVE=0` (read at each row) leaves the torch path;
`problem()` says why the kernel is not in use. Depends on ctypes and torch only.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Optional

import torch

from ..runtime import native_build

__all__ = ["error", "available", "problem"]

_VERSION = 2
_SOURCE = Path(__file__).with_name("_diverge_errors.c")
_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
_OK, _ZERO_POS, _ZERO_NEG = 0, 2, 3
_MAX_DIMS = 16  # MAX_DIMS of the C code


def _load():
    library, target = native_build.load(_SOURCE, "diverge-errors")
    version = library.nsp_diverge_errors_version
    version.restype = ctypes.c_int64
    if version() != _VERSION:
        raise RuntimeError(f"{target} is version {version()} of the diverge errors, not {_VERSION}: delete it to rebuild")
    call = library.nsp_diverge_error
    call.restype = ctypes.c_int64
    call.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                     ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_double, ctypes.POINTER(ctypes.c_float))
    return call


_loaded = native_build.Loaded(_load)


def available() -> bool:
    """Whether the kernel is in use now (built or loaded on the first call)."""
    return _loaded.get() is not None


def problem() -> Optional[str]:
    """Why the kernel is not in use (None when it is)."""
    return _loaded.problem()


def error(x: torch.Tensor, ref: torch.Tensor, limit: float) -> Optional[float]:
    """`relative_error(x, ref)`'s common case (float32 work): max |x - ref| / (|ref| + s), s = max |ref|,
    where `ref` (float32) and `x` (float32, bfloat16 or float16) are CPU tensors of one shape, both
    contiguous or views whose last dimension is contiguous in both (a split, a transpose of the leading
    dimensions), s < `limit`, and no quotient is NaN or infinite; None anywhere else (the caller's torch
    path decides)."""
    call = _loaded.get()
    kind = _KINDS.get(x.dtype)
    if (call is None or kind is None or ref.dtype != torch.float32 or not ref.is_cpu or not x.is_cpu
            or x.shape != ref.shape or ref.layout != torch.strided or x.layout != torch.strided):
        return None
    numel = ref.numel()
    if numel == 0:
        return None
    out = ctypes.c_float()
    if ref.is_contiguous() and x.is_contiguous():
        status = call(ref.data_ptr(), x.data_ptr(), kind, numel, 0, None, None, None, float(limit), ctypes.byref(out))
    else:
        ndim, sizes = ref.dim(), ref.shape
        if not 0 < ndim <= _MAX_DIMS or (sizes[-1] != 1 and (ref.stride(-1) != 1 or x.stride(-1) != 1)):
            return None
        dims = ctypes.c_int64 * ndim
        status = call(ref.data_ptr(), x.data_ptr(), kind, numel, ndim, dims(*sizes), dims(*ref.stride()),
                      dims(*x.stride()), float(limit), ctypes.byref(out))
    if status == _OK:
        return out.value
    if status == _ZERO_POS:  # the torch path's max(-min, max) of +0s is -0.0
        return -0.0
    if status == _ZERO_NEG:
        return 0.0
    return None
