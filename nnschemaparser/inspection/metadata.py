"""Static metadata of a constructed PyTorch model: what is registered where, and how big it is.

`inspect_model` reads the registered modules, parameters and buffers of a model that already exists
and turns them into frozen records. It is a pure read: no forward pass runs, no hook fires, no lazy
module gets materialized, nothing moves between devices and no training flag flips. Numbers are
element counts, not bytes, so records compare equal across devices and dtypes.

This module depends only on torch and the standard library. It must not import the parser, the
schema, the interpreter or any view: those layers may read these records, never the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn
from torch.nn.parameter import is_lazy

__all__ = ["ModuleMetadata", "ModelMetadata", "inspect_model", "ROOT_PATH", "qualified_type_name"]

#: Path used for the model itself, which `named_modules` reports as the empty string.
ROOT_PATH = "<root>"


@dataclass(frozen=True)
class ModuleMetadata:
    """Counts for one registered module, covering only state registered on that module itself.

    Attributes:
        path: Dotted registration path from the model, or ``"<root>"`` for the model itself.
        module_type: Fully qualified class name of the module instance.
        direct_parameters: Elements in the initialized parameters held directly by this module.
        trainable_parameters: The part of ``direct_parameters`` whose tensors require gradients.
        direct_buffers: Elements in the initialized buffers held directly by this module.
        training: The module's own ``training`` flag when it was inspected.
    """

    path: str
    module_type: str
    direct_parameters: int
    trainable_parameters: int
    direct_buffers: int
    training: bool


@dataclass(frozen=True)
class ModelMetadata:
    """Counts for a whole model plus one `ModuleMetadata` per distinct registered module.

    Attributes:
        model_type: Fully qualified class name of the inspected model.
        total_parameters: Elements in every initialized parameter reachable from the model; a
            parameter shared by several modules (tied weights) is counted once.
        trainable_parameters: The part of ``total_parameters`` whose tensors require gradients.
        modules: One record per distinct module, root first, in ``named_modules`` order.
    """

    model_type: str
    total_parameters: int
    trainable_parameters: int
    modules: tuple[ModuleMetadata, ...]


def qualified_type_name(obj: object) -> str:
    """Return ``module.QualName`` of the runtime type of `obj`, e.g. ``torch.nn.modules.linear.Linear``."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def inspect_model(model: nn.Module) -> ModelMetadata:
    """Describe the registered state of `model` without running or changing it.

    Each module record counts only what is registered directly on that module; the model totals
    count every reachable parameter once, even when several modules share it. Parameters and
    buffers of lazy modules that are not initialized yet count as zero elements, while any state
    already initialized on such a module is counted normally.

    Raises:
        TypeError: `model` is not an ``nn.Module`` instance.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(_not_a_module_message(model))

    records = []
    seen: set[int] = set()
    total = trainable = 0
    # named_modules already yields a module reached through several paths only once.
    for name, module in model.named_modules():
        direct = _direct_tensors(module.parameters(recurse=False))
        buffers = _direct_tensors(module.buffers(recurse=False))
        records.append(
            ModuleMetadata(
                path=name or ROOT_PATH,
                module_type=qualified_type_name(module),
                direct_parameters=sum(_element_count(p) for p in direct),
                trainable_parameters=sum(_element_count(p) for p in direct if p.requires_grad),
                direct_buffers=sum(_element_count(b) for b in buffers),
                training=bool(module.training),
            )
        )
        for param in direct:
            # Tied weights show up under every owning module but are one tensor: count it once.
            if id(param) in seen:
                continue
            seen.add(id(param))
            total += _element_count(param)
            if param.requires_grad:
                trainable += _element_count(param)

    return ModelMetadata(
        model_type=qualified_type_name(model),
        total_parameters=total,
        trainable_parameters=trainable,
        modules=tuple(records),
    )


def _direct_tensors(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Materialize an iterator of tensors once, so counting and de-duplication see the same list."""
    return [t for t in tensors if t is not None]


def _element_count(tensor: torch.Tensor) -> int:
    # An uninitialized lazy tensor has no shape yet; asking for numel() would raise.
    if is_lazy(tensor):
        return 0
    return int(tensor.numel())


def _not_a_module_message(value: object) -> str:
    if isinstance(value, type) and issubclass(value, nn.Module):
        return (
            f"inspect_model expects a constructed torch.nn.Module instance, got the class "
            f"{value.__module__}.{value.__qualname__} itself; construct it first, e.g. "
            f"inspect_model({value.__qualname__}(...))."
        )
    return (
        f"inspect_model expects a torch.nn.Module instance, got a value of type "
        f"{qualified_type_name(value)}; pass the model object, not its outputs or state_dict."
    )
