"""What a reused call's arguments and results are compared by: frozen values and bit-identical tensors.

`freeze(value)` is what a recording keeps of an argument, `same(frozen, value, memo)` whether a later
call's argument is that one:

- a tensor: the same object still at its recorded version (`_version`), or one of the same type,
  dtype, shape, strides, device, layout and `requires_grad` with the same bits (floats compared as
  integers of their width: NaNs and signed zeros as stored);
- a number, string, bytes, `None`, dtype, device or `torch.Size`: of the same type and equal (floats
  bit for bit);
- a module, function, class or enum member: the same object;
- a tuple, list or dict: item by item;
- another object with a `__dict__` (a model's config, a cache): the same object, with its attributes
  frozen the same way, up to `_DEPTH` objects deep (a write into it, however deep within that, makes
  it another value).

Anything else (a generator, an object with slots only, anything deeper) raises `TypeError`: the call
that got it is never reused. `memo` keeps, for one run, the pairs of tensors already found
bit-identical, so a value passed to every layer (positions) is compared once per run.

`result_state(value)` is what a recording keeps of a result it may hand out again (the versions of
a tensor, a number, a string, `None` or a tuple of those; anything else raises `TypeError`), and
`result_intact(value, state)` whether it still holds what was returned.

Depends on torch only.
"""

from __future__ import annotations

import math
import types
from enum import Enum
from typing import Any

import torch
from torch import nn

__all__ = ["freeze", "same", "bits_equal", "result_state", "result_intact", "UNSUPPORTED"]

UNSUPPORTED = "an argument or result the reuse cannot compare or hand out again"
_PRIMITIVE = (type(None), bool, int, str, bytes, torch.dtype, torch.device, torch.Size)
_BY_IDENTITY = (nn.Module, types.FunctionType, types.BuiltinFunctionType, types.MethodType, type, Enum,
                types.ModuleType)
_NOT_STATE = (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType, types.FrameType)
_INT_OF_SIZE = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}
_MISSING = object()
_DEPTH = 4  # objects inside objects compared by their attributes (a config's sub-configs)


def freeze(value: Any, depth: int = 0) -> Any:
    """What is recorded of an argument (see the module docstring)."""
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_nested:
            raise TypeError(UNSUPPORTED)
        return ("t", value, value._version)
    kind = type(value)
    if kind in _PRIMITIVE or kind is float:
        return ("v", value)
    if isinstance(value, _BY_IDENTITY):
        return ("o", value)
    if kind is tuple or kind is list:
        return (kind, tuple(freeze(item, depth) for item in value))
    if kind is dict:
        return (dict, tuple((key, freeze(item, depth)) for key, item in value.items()))
    attributes = getattr(value, "__dict__", None)
    if type(attributes) is dict and depth < _DEPTH and not isinstance(value, _NOT_STATE):
        # the attributes as they are (compared by identity first), and those that can change inside
        inner = tuple((key, freeze(item, depth + 1)) for key, item in attributes.items()
                      if type(item) not in _PRIMITIVE and type(item) is not float)
        return ("b", value, dict(attributes), inner)
    raise TypeError(UNSUPPORTED)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same type, dtype, shape, strides, device and bits (NaNs and signed zeros as stored)."""
    if (type(a) is not type(b) or a.dtype != b.dtype or a.shape != b.shape or a.stride() != b.stride()
            or a.device != b.device or a.requires_grad != b.requires_grad or a.layout != b.layout):
        return False
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.is_floating_point():
        as_int = _INT_OF_SIZE.get(a.element_size())
        if as_int is None:
            return False
        a, b = a.view(as_int), b.view(as_int)
    return torch.equal(a, b)


def same(frozen: Any, value: Any, memo: dict) -> bool:
    """Whether `value` is what `frozen` recorded; `memo` (one run's) keeps tensor pairs found equal."""
    tag = frozen[0]
    if tag == "t":
        recorded, version = frozen[1], frozen[2]
        if recorded._version != version:  # changed in place since: it no longer holds what was passed
            return False
        if value is recorded:
            return True
        if not isinstance(value, torch.Tensor):
            return False
        key = (id(value), id(recorded))
        known = memo.get(key)
        if known is not None and known[0] is value and known[1] == value._version:
            return True
        if not bits_equal(value, recorded):
            return False
        memo[key] = (value, value._version, recorded)  # holding both keeps their ids theirs for the run
        return True
    if tag == "v":
        recorded = frozen[1]
        if value is recorded:
            return True
        if type(value) is not type(recorded):
            return False
        if type(value) is float:
            return value == recorded and math.copysign(1.0, value) == math.copysign(1.0, recorded)
        return value == recorded
    if tag == "o":
        return value is frozen[1]
    if tag == "b":
        if value is not frozen[1]:
            return False
        now, before = value.__dict__, frozen[2]
        return (len(now) == len(before) and all(now.get(key, _MISSING) is item for key, item in before.items())
                and all(same(item, now[key], memo) for key, item in frozen[3]))
    if type(value) is not tag:
        return False
    items = frozen[1]
    if tag is dict:
        return len(value) == len(items) and all(key in value and same(item, value[key], memo) for key, item in items)
    return len(value) == len(items) and all(same(item, part, memo) for item, part in zip(items, value))


def result_state(value: Any) -> Any:
    """The versions of a result that may be handed out again (a tensor, a primitive, a tuple of those)."""
    if isinstance(value, torch.Tensor):
        return value._version
    if type(value) in _PRIMITIVE or type(value) is float:
        return None
    if type(value) is tuple:
        return tuple(result_state(item) for item in value)
    raise TypeError(UNSUPPORTED)


def result_intact(value: Any, state: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value._version == state
    if type(value) is tuple:
        return all(result_intact(item, part) for item, part in zip(value, state))
    return True
