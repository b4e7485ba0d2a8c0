"""Which op types an inspection keeps: the `compressor=` argument of `ModelInspector`.

A compressor decides which ops it can act on by their type. `op_types_of` reads that set from
what the user passes:

- None: every op (no filtering);
- a set (or list, tuple, frozenset) of op-type strings: `{"linear", "conv2d"}`;
- a compressor-like object or class with a registry of op types: the first of the attributes
  `compressible_op_types`, `supported_op_types`, `op_types`, `registry` that it has, holding a
  collection of op-type strings or a mapping keyed by them (a method returning one is called).

Two ready sets: `QUANTIZABLE_OP_TYPES`, the linear, convolution and matrix-product ops a weight
and activation quantiser targets, and `PALETTIZABLE_OP_TYPES`, the ops that read a weight tensor
(linear, convolutions, embeddings), which weight palettisation (k-means clustering of weights)
targets. Names are those of both execution modes: eager op types come from the callable's name
(`F.linear` -> `linear`, `a @ b` -> `matmul`), graph op types from the aten overload packet
(`aten.linear.default` -> `linear`).

Depends on nothing of the package.
"""

from __future__ import annotations

from typing import Any, Collection, Mapping, Optional

__all__ = ["QUANTIZABLE_OP_TYPES", "PALETTIZABLE_OP_TYPES", "op_types_of"]

_CONVOLUTIONS = frozenset({"conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                           "convolution", "_convolution"})

QUANTIZABLE_OP_TYPES: frozenset[str] = frozenset({
    "linear", "addmm", "mm", "bmm", "baddbmm", "matmul", "einsum",
}) | _CONVOLUTIONS

PALETTIZABLE_OP_TYPES: frozenset[str] = frozenset({
    "linear", "embedding", "embedding_bag",
}) | _CONVOLUTIONS

_REGISTRY_ATTRIBUTES = ("compressible_op_types", "supported_op_types", "op_types", "registry")


def _as_types(value: Any, where: str) -> frozenset[str]:
    if isinstance(value, Mapping):
        value = list(value.keys())
    if isinstance(value, (str, bytes)) or not isinstance(value, Collection):
        raise TypeError(f"{where} must be a collection of op-type strings such as {{'linear', 'conv2d'}}, "
                        f"got {type(value).__name__}")
    bad = [item for item in value if not isinstance(item, str)]
    if bad:
        raise TypeError(f"{where} holds non-string op types {bad[:3]!r}; op types are strings such as 'linear'")
    return frozenset(value)


def op_types_of(compressor: Any) -> Optional[frozenset[str]]:
    """The op types `compressor` keeps (None: all), from a set of types or an object with a registry."""
    if compressor is None:
        return None
    if isinstance(compressor, (set, frozenset, list, tuple)):
        return _as_types(compressor, "compressor")
    for attribute in _REGISTRY_ATTRIBUTES:
        if hasattr(compressor, attribute):
            registry = getattr(compressor, attribute)
            if callable(registry) and not isinstance(registry, (Mapping, Collection)):
                registry = registry()
            name = getattr(compressor, "__name__", type(compressor).__name__)
            return _as_types(registry, f"{name}.{attribute}")
    raise TypeError(f"compressor must be None, a set of op types (e.g. QUANTIZABLE_OP_TYPES) or an object with a "
                    f"registry of op types (one of the attributes {', '.join(_REGISTRY_ATTRIBUTES)}); "
                    f"{type(compressor).__name__} has none")
