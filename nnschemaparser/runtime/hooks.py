"""Module forward hooks around an interpreted forward, as `Module._call_impl` runs them.

`call_with_hooks(module, args, kwargs, direct)` runs global and module forward pre-hooks (with and
without kwargs), then `direct` (the schema of the forward), then forward hooks, honouring
"always call" hooks on failure; with backward hooks registered the call goes to the real module,
which wraps tensors exactly. `global_hooks_active()` is the cheap check the invokers make per call.

A forward replaced on the instance (`module.forward = ...`, as accelerate's `add_hook_to_module`
does) is what `_call_impl` calls: `forward_slot` finds the instance attribute where that
replacement keeps the bound class forward it calls (accelerate's `_old_forward`), and
`call_with_hooks` runs the replacement with the schema in that slot, so the replacement's own work
(moving offloaded weights in, and out again) happens around the schema. A replacement that keeps no
such slot never calls the class forward through the instance: the call goes to the real module.

Depends on torch only.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from torch import nn
from torch.nn.modules import module as _module_impl

__all__ = ['call_with_hooks', 'global_hooks_active', 'forward_slot']


def global_hook_dicts() -> tuple:
    names = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
             "_global_backward_pre_hooks")
    return tuple(getattr(_module_impl, name) for name in names if hasattr(_module_impl, name))


GLOBAL_HOOK_DICTS = global_hook_dicts()


def global_hooks_active() -> bool:
    for hooks in GLOBAL_HOOK_DICTS:
        if hooks:
            return True
    return False


def _is_bound_to(value: Any, module: nn.Module, function: Any) -> bool:
    return getattr(value, "__self__", None) is module and getattr(value, "__func__", None) is function


def forward_slot(module: nn.Module) -> Optional[str]:
    """Where an instance-level `forward` keeps the bound class forward it calls.

    "" when the instance attribute is the bound class forward itself (nothing replaced), the name of
    the attribute holding it otherwise (accelerate: "_old_forward"), None when there is none.
    """
    store = module.__dict__
    function = type(module).forward
    if _is_bound_to(store.get("forward"), module, function):
        return ""
    for key, value in store.items():
        if key != "forward" and _is_bound_to(value, module, function):
            return key
    return None


def _forward_call(module: nn.Module, direct: Callable) -> Callable:
    """What `_call_impl` calls between the hooks: the schema, inside an instance-level replacement."""
    if "forward" not in module.__dict__:
        return direct
    slot = forward_slot(module)
    if not slot:
        return direct
    store = module.__dict__

    def replaced(args: Any, kwargs: dict) -> Any:
        saved = store[slot]
        store[slot] = lambda *a, **k: direct(a, k)  # the class forward the replacement calls: the schema
        try:
            return store["forward"](*args, **kwargs)
        finally:
            store[slot] = saved

    return replaced


def call_with_hooks(module: nn.Module, args: Any, kwargs: dict, direct: Callable, lowered: Any = None) -> Any:
    """`Module._call_impl`'s forward-hook protocol around `direct` (the schema of the forward).
    `lowered`: the instance `forward` the schema was lowered from, when it was (a forward replaced on
    the instance by a bound function); while the instance holds it, the schema runs in its place."""
    has_backward = (module._backward_hooks or module._backward_pre_hooks
                    or getattr(_module_impl, "_global_backward_hooks", None)
                    or getattr(_module_impl, "_global_backward_pre_hooks", None))
    if has_backward:
        return module(*args, **kwargs)  # backward hooks wrap tensors: let the real call do it exactly
    current = module.__dict__.get("forward")
    if lowered is not None:
        if current is not lowered:
            return module(*args, **kwargs)  # the forward lowered was replaced or removed since: the real call
    elif current is not None and forward_slot(module) is None:
        return module(*args, **kwargs)  # a replaced forward that never calls the class's: the real call
    direct = _forward_call(module, direct)
    args = tuple(args)
    pre_kwargs = getattr(module, "_forward_pre_hooks_with_kwargs", {})
    for hook_id, hook in (*_module_impl._global_forward_pre_hooks.items(), *module._forward_pre_hooks.items()):
        if hook_id in pre_kwargs:
            result = hook(module, args, kwargs)
            if result is not None:
                if isinstance(result, tuple) and len(result) == 2:
                    args, kwargs = result
                else:
                    raise RuntimeError("forward pre-hook must return None or a tuple of (new_args, new_kwargs), "
                                       f"but got {result}.")
        else:
            result = hook(module, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
    hook_kwargs = getattr(module, "_forward_hooks_with_kwargs", {})
    always = getattr(module, "_forward_hooks_always_called", {})
    global_always = getattr(_module_impl, "_global_forward_hooks_always_called", {})
    try:
        result = direct(args, kwargs)
    except BaseException:
        for hook_id, hook in (*_module_impl._global_forward_hooks.items(), *module._forward_hooks.items()):
            if hook_id in always or hook_id in global_always:
                try:
                    if hook_id in hook_kwargs:
                        hook(module, args, kwargs, None)
                    else:
                        hook(module, args, None)
                except Exception:
                    pass
        raise
    for hook_id, hook in (*_module_impl._global_forward_hooks.items(), *module._forward_hooks.items()):
        if hook_id in hook_kwargs:
            hook_result = hook(module, args, kwargs, result)
        else:
            hook_result = hook(module, args, result)
        if hook_result is not None:
            result = hook_result
    return result
