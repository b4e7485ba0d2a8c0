"""Modules the parser treats specially, and the module state a run may change beyond its tensors.

`opaque_reason` says why a module has no Python forward to lower (TorchScript, a `torch.compile`
wrapper, a forward replaced on the instance that never calls the class's): such a module runs as the
real module and is listed in `skipped` with that reason. `weight_repr` describes a registered
tensor, a lazy module's uninitialised one included. `snapshot` and `ClassAndHooks` let
`preserved_state` put back what a lazy module's first call changes in place: the tensors' data and
class, the module's class, its hook dicts and private attributes.

Depends on torch, the schema and `runtime.hooks`.
"""

from __future__ import annotations

import types
from typing import Optional

import torch
from torch import nn

from ..runtime.hooks import forward_slot
from ..schema.model import TensorRepr, TensorReprWithValue

__all__ = ["held_modules", "replaced_forward", "opaque_reason", "is_compiled", "weight_repr", "tensors_of_module", "snapshot", "ClassAndHooks"]


def held_modules(module: nn.Module):
    """(attribute, module) for each module `module` holds as a plain instance attribute, not
    registered in `_modules`: TransformerLens's `TransformerBridge` keeps the HF model it wraps as
    `self.__dict__["original_model"]` (and calls it through a driver object), so that its
    parameters are not listed twice. Such a module runs whenever the forward reaches it, so it
    gets a block under the attribute's name, like a sub-module."""
    registered = module._modules
    for attr, value in list(module.__dict__.items()):
        if isinstance(value, nn.Module) and attr not in registered:
            yield attr, value


def opaque_reason(module: nn.Module) -> Optional[str]:
    """Why `module` has no Python forward to lower and runs as the real module (None: it has one).

    TorchScript modules (`torch.jit.script` / `torch.jit.trace`) and `torch.compile` wrappers carry
    compiled code, not Python source; their sub-modules belong to that code and get no blocks. So does
    a forward replaced on the instance that never calls the class's (accelerate's hooks do call it,
    through `_old_forward`, and run interpreted: see `runtime.hooks`).
    """
    if isinstance(module, torch.jit.ScriptModule):
        how = "traced" if isinstance(module, torch.jit.TracedModule) else "scripted"
        return (f"{type(module).__name__} is TorchScript ({how} with torch.jit): its forward is compiled "
                "TorchScript, not Python source, so it runs as the real module")
    if is_compiled(module):
        return (f"{type(module).__name__} is a torch.compile wrapper: it runs as the compiled module; parse its "
                "original (`._orig_mod`) to see its code")
    if "forward" in module.__dict__ and forward_slot(module) is None:
        replacement = module.__dict__["forward"]
        name = getattr(replacement, "__qualname__", type(replacement).__name__)
        return (f"its forward is replaced on the instance by {name}, which does not call the class's forward "
                "through the instance, so it runs as the real module")
    return None


def replaced_forward(module: nn.Module) -> Optional[types.FunctionType]:
    """The plain function of a forward replaced on the instance and bound to it, which the parser
    lowers as the block's forward (TransformerLens's `T5BlockBridge` puts
    `types.MethodType(patched_forward, block)` there, a closure over the bridge); None when the
    forward is not replaced, calls the class's through the instance (`forward_slot`), or is not such
    a bound function (a `functools.partial`, a builtin, a decorated function)."""
    if isinstance(module, torch.jit.ScriptModule) or is_compiled(module):
        return None
    replacement = module.__dict__.get("forward")
    if replacement is None or forward_slot(module) is not None:
        return None
    if not isinstance(replacement, types.MethodType) or replacement.__self__ is not module:
        return None
    function = replacement.__func__
    if not isinstance(function, types.FunctionType) or "__wrapped__" in function.__dict__:
        return None
    return function


def is_compiled(module: nn.Module) -> bool:
    """A `torch.compile(module)` wrapper (dynamo's OptimizedModule), found without importing dynamo."""
    cls = type(module)
    return cls.__name__ == "OptimizedModule" and cls.__module__.startswith("torch._dynamo") and \
        isinstance(module.__dict__.get("_modules", {}).get("_orig_mod"), nn.Module)


def weight_repr(value: torch.Tensor) -> TensorRepr:
    """A registered tensor's repr; a lazy module's uninitialised one has no shape yet (and is not read)."""
    if isinstance(value, nn.parameter.UninitializedTensorMixin):
        return TensorRepr(shape=(), dtype=type(value).__name__)
    return TensorReprWithValue(shape=tuple(value.shape), dtype=str(value.dtype), value=value.detach())


def tensors_of_module(module: nn.Module) -> list[torch.Tensor]:
    return [v for store in (module._parameters, module._buffers) for v in store.values() if v is not None]


def snapshot(value: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A copy to restore `value` from; None for none or for a lazy module's uninitialised tensor."""
    if value is None or isinstance(value, nn.parameter.UninitializedTensorMixin):
        return None
    return value.detach().clone()


class ClassAndHooks:
    """A module's class, hook dicts and private attributes, as a run may change them.

    Restoring puts all of them back as they were, and removes private attributes the run added, so
    hooks and the flags that record them stay consistent.

    A lazy module's first call (`nn.LazyLinear`) infers its shapes in a forward pre-hook, removes
    that hook and its load hook, deletes the handles and turns into its `cls_to_become`; restoring
    puts all of that back, so the module stays uninitialised as the user had it.
    """

    _STORES = ("_parameters", "_buffers", "_modules")

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.cls = type(module)
        self.private = {k: v for k, v in module.__dict__.items() if k.startswith("_")}
        self.hooks = {k: list(v.items()) for k, v in self.private.items()
                      if isinstance(v, dict) and "hooks" in k and k not in self._STORES}

    def restore(self) -> None:
        module = self.module
        if type(module) is not self.cls:
            module.__class__ = self.cls
        # A private attribute the run added goes too: it may record what the run did to the hooks
        # restored below (transformers' `_output_capturing_hooks_installed` says its hooks are there;
        # kept alone, the model would never install them again and lose its hidden states).
        for key in [k for k in module.__dict__ if k.startswith("_") and k not in self.private]:
            del module.__dict__[key]
        for key, value in self.private.items():
            if module.__dict__.get(key, _ABSENT) is not value:
                module.__dict__[key] = value
        for key, items in self.hooks.items():
            store = self.private[key]
            now = list(store.items())
            if len(now) != len(items) or any(a[0] != b[0] or a[1] is not b[1] for a, b in zip(now, items)):
                store.clear()
                store.update(items)


_ABSENT = object()
