"""A model parsed inside another library's wrapper: where the inner model sits, and a `keep=` written for the
inner model's paths refused with how to reach it.

A schema parsed from a wrapper has the wrapper's paths: a PEFT `PeftModel` puts GPT-2's layers at
`base_model.model.h.3`, a DDP or FSDP1 module at `module.h.3`. A `keep=` written for the inner model
(`call=h.*`) names no block there, and would keep nothing: `check_keep_reaches` refuses it before the
run with `KeepWrappedError`, which names the wrapper, the path of the inner model, the same term under
it, and how to reach the inner model to parse it instead (`model.get_base_model()`, `model.module`).

What each wrapper does to a schema, as tested in tests/traces/test_wrapped_models.py:

- `torch.compile(model)`: the parse reads the compiled module's `_orig_mod` (its paths are the model's);
  a schema parsed before compiling runs the model itself. Either way `keep=` keeps what it names.
- accelerate: `Accelerator().prepare(model)` returns the model (hooks of mixed precision or device
  placement around its forward); `accelerate.hooks` wrap a module's forward. A schema parsed before or
  after keeps what `keep=` names.
- PEFT `get_peft_model(model, config)` swaps LoRA layers into the model itself: a schema of the model
  parsed before runs them (equal to the PEFT model), and keeps what it named. A schema of the
  `PeftModel` has its paths (see above).
- nnsight is not installed here, so its wrapper is not mimicked; `KeepMissedWarning` (traces/missed.py)
  names it when a keep kept nothing.

Depends on schema and traces.selection; never on the runtime or views.
"""

from __future__ import annotations

from typing import Any, Optional

from ..schema.errors import NNSchemaError
from .selection import KeepSelector, KeepTerm, path_matches

__all__ = ["KeepWrappedError", "inner_model", "check_keep_reaches"]


class KeepWrappedError(NNSchemaError):
    """A `keep=` written for the paths of a wrapped model, given a schema of its wrapper (a PEFT model, DDP...):
    it names the path of the inner model and how to reach it."""


_CONTAINERS = {"DistributedDataParallel": "DDP", "DataParallel": "DataParallel",
               "FullyShardedDataParallel": "FSDP (1)"}


def inner_model(module: Any) -> Optional[tuple[str, Any, str, str]]:
    """(the wrapper in words, the inner model, its path in the wrapper's module tree, how to reach it) when
    `module` is a wrapper this knows (PEFT, torch.compile, DDP, DataParallel, FSDP1, accelerate's DDP); None
    otherwise."""
    kind = type(module)
    inner, how, what = None, "", ""
    if kind.__module__.startswith("peft") and callable(getattr(module, "get_base_model", None)):
        inner, how, what = module.get_base_model(), "model.get_base_model()", f"PEFT {kind.__name__}"
    elif kind.__name__ == "OptimizedModule" and hasattr(module, "_orig_mod"):
        inner, how, what = module._orig_mod, "model._orig_mod", "torch.compile module"
    elif kind.__name__ in _CONTAINERS and hasattr(module, "module"):
        inner, how, what = module.module, "model.module", _CONTAINERS[kind.__name__]
    if inner is None or inner is module or not hasattr(module, "named_modules"):
        return None
    path = next((name for name, child in module.named_modules() if child is inner), None)
    if not path:
        return None
    return what, inner, path, how


def check_keep_reaches(schema: Any, selector: Optional[KeepSelector]) -> None:
    """Refuse (`KeepWrappedError`) a term of `selector` whose block or call glob names no block of `schema` but
    names one of the model inside the wrapper `schema` was parsed from, once that model's path is taken off."""
    if selector is None:
        return
    found = inner_model(getattr(schema, "module", None))
    if found is None:
        return
    what, inner, prefix, how = found
    paths = [b.path for b in schema.iter_blocks() if b.path]
    inside = [p[len(prefix) + 1:] for p in paths if p.startswith(prefix + ".")]
    for term in selector.terms:
        for field, within in (("block", True), ("call", False)):
            glob = getattr(term, field)
            if glob is None or any(path_matches(p, glob, within) for p in paths):
                continue
            if any(path_matches(p, glob, within) for p in inside):
                fixed = KeepTerm(**{**{k: getattr(term, k) for k in ("block", "var", "op", "slot", "call")},
                                    field: f"{prefix}.{glob}"})
                raise KeepWrappedError(
                    f"keep term {term.text()!r} names no block of this schema: it was parsed from a {what}, which "
                    f"holds the {type(inner).__name__} at {prefix!r}, so its blocks are {prefix}.<path>. Keep "
                    f"{fixed.text()!r}, or parse the inner model ({how}) and keep what you wrote")
