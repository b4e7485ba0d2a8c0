"""What activation and attribution patching share: the sites a selector names, their parts, the state watch.

`SiteValue`: one place a selector named in a run (its block path, variable, occurrence, layer, a
label) and the tensor bound there. `look_at(at)` turns `at=` into the interventions that collect
them without changing anything (the value handed back is the very object).

Parts: `per=None` is the whole value; `per="position"` a position, the value's axis 1 (`[batch,
position, ...]`, the index `[:, p]`); `per="head"` a head: the number of heads is `heads=` or read
off the nearest block at or above the site (`num_heads`, `n_head`, `num_attention_heads`,
`n_heads`, or its `config`'s `num_attention_heads` / `n_head`), and the head axis is axis 2 of a
`[batch, position, head, head_dim]` value (axis 1 of a `[batch, head, position, head_dim]` one when
only that axis has that size), or else the last axis split into `heads` equal slices, as attention
concatenates heads before its output projection (`[..., h*d:(h+1)*d]`). Pick the value before that
projection (GPT-2's `transformer.h.*.attn:attn_output occurrence=1`, Llama's
`model.layers.*.self_attn:attn_output occurrence=1`): after it, a slice of the last axis is no head.

`StateWatch`: what a recorded run wrote outside its arguments (parameters and buffers, module
attributes, the Python state `parser.python_state` records with what its names hold, the random
generators; `running()` around the recorded run adds the globals of each module the run's code
reaches), so that a replay that would skip such a write is turned off, with the reason.
`function_watch(fn)`: the same check around one function call of the recorded run (the Python state
the function reaches, `PythonState.reached_by`, and the random generators),
`runtime.reuse.CallReuse.watch`.

Depends on torch, runtime.interpreter (a row's run), traces.interventions and parser.python_state.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from ..parser.python_state import PythonState
from ..runtime.interpreter import SchemaInterpreter
from ..schema.model import ModelBlockSchema
from .interventions import Intervention, InterventionError, Site, intervention

__all__ = ["SiteValue", "PatchedRun", "selector_of", "look_at", "parts_of", "check_same_sites", "metric_value",
           "StateWatch", "function_watch", "DREW", "rng_state", "set_rng_state"]

PER = (None, "position", "head")
_HEAD_ATTRS = ("num_heads", "n_head", "num_attention_heads", "n_heads")


@dataclass
class SiteValue:
    """A place `at=` named in a run and the tensor bound there."""

    path: str
    var: str
    occurrence: int
    layer: Optional[int]
    call: Optional[str]
    label: str
    value: Any
    bound: Any = None  # a copy of the value as bound (`look_at(copy=True)`): the run may change it in place later

    @property
    def selector(self) -> str:
        """The selector naming this variable (with `occurrence` it names this one binding)."""
        return f"{self.path}:{self.var}"


@dataclass
class PatchedRun:
    """A run of `schema` on `inputs` with `interventions`: what reproduces one row of a patching
    DataFrame (`outputs()` runs it; a view can open it as a fork)."""

    schema: ModelBlockSchema = field(repr=False)
    inputs: dict = field(repr=False)
    interventions: list
    site: str

    def outputs(self) -> Any:
        """What the model returns in this run (as `metric` got it)."""
        return SchemaInterpreter()._execute(self.schema, dict(self.inputs), interventions=self.interventions)


def selector_of(at: Any, function: str) -> Intervention:
    """`at=` as an `Intervention` (its selector and `occurrence=`); an `index=` is refused."""
    if at is None:
        raise InterventionError(f"{function} needs at=, a selector such as 'call=transformer.h.*' (every layer's "
                                "output) or 'transformer.h.*.attn:attn_output'")
    item = at if isinstance(at, Intervention) else intervention(at, lambda value, site: value)
    if item.index is not None:
        raise InterventionError(f"{function}: at={at!r} has an index=; name whole values and choose the parts with "
                                "per='position' or per='head'")
    return item


def look_at(item: Intervention, found: list, make: Optional[Callable[[torch.Tensor, Site], torch.Tensor]] = None,
            copy: bool = False) -> list:
    """Interventions that append a `SiteValue` to `found` at each site `item` names; the value handed
    back is `make(value, site)` (default: the value itself, the very object); `copy`: also keep a
    detached copy of the value as bound (`SiteValue.bound`)."""
    counts: dict[str, int] = {}

    def look(value: torch.Tensor, site: Site) -> torch.Tensor:
        if site.call is not None:  # the n-th call of that block
            base = f"{site.call}:output"
            n = counts[base] = counts.get(base, -1) + 1
        else:
            base, n = f"{site.path}:{site.var}", site.occurrence
        new = make(value, site) if make is not None else value
        found.append(SiteValue(site.path, site.var, site.occurrence, site.layer, site.call,
                               base if n == 0 else f"{base}#{n}", new, value.detach().clone() if copy else None))
        return new

    return [Intervention(item.selector, look, occurrence=item.occurrence)]


def check_same_sites(clean: list, corrupted: list) -> None:
    """The clean and corrupted runs must bind the same sites with values of the same shape and dtype."""
    if [s.label for s in clean] != [s.label for s in corrupted]:
        a, b = [s.label for s in clean], [s.label for s in corrupted]
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        raise InterventionError(f"the clean and corrupted runs reach different sites ({len(a)} and {len(b)}; first "
                                f"difference at site {first}: {a[first] if first < len(a) else '(none)'} and "
                                f"{b[first] if first < len(b) else '(none)'}); patching needs the same path through "
                                "the model: give inputs of the same shapes that take the same branches")
    for a, b in zip(clean, corrupted):
        if a.value.shape != b.value.shape or a.value.dtype != b.value.dtype:
            raise InterventionError(f"{a.label} has shape {tuple(a.value.shape)} ({a.value.dtype}) in the clean run and "
                                    f"{tuple(b.value.shape)} ({b.value.dtype}) in the corrupted one; give prompts of the "
                                    "same length (pad them) so each site can be patched")


def _heads_of(schema: ModelBlockSchema, path: str) -> Optional[int]:
    module = schema.module
    if module is None:
        return None
    parts = path.split(".") if path and path != (schema.path or schema.name) else []
    for cut in range(len(parts), -1, -1):
        try:
            held = module.get_submodule(".".join(parts[:cut])) if cut else module
        except AttributeError:
            continue
        for owner in (held, getattr(held, "config", None)):
            for attr in _HEAD_ATTRS:
                value = getattr(owner, attr, None) if owner is not None else None
                if type(value) is int and value > 0:
                    return value
    return None


def parts_of(schema: ModelBlockSchema, site: SiteValue, per: Optional[str], heads: Optional[int]) -> list:
    """[(number or None, index or None)]: the parts of `site`'s value one row each stands for."""
    shape = tuple(site.value.shape)
    if per is None:
        return [(None, None)]
    if per == "position":
        if len(shape) < 2:
            raise InterventionError(f"per='position': {site.label} has shape {shape}, with no position axis (axis 1 "
                                    "of a [batch, position, ...] value)")
        return [(p, (slice(None), p)) for p in range(shape[1])]
    count = heads if heads is not None else _heads_of(schema, site.path if site.call is None else site.call)
    if count is None:
        raise InterventionError(f"per='head': no number of heads found at or above {site.path} (num_heads, n_head, "
                                "num_attention_heads or a config with one); pass heads=N")
    if len(shape) == 4 and shape[2] == count:
        return [(h, (slice(None), slice(None), h)) for h in range(count)]
    if len(shape) == 4 and shape[1] == count:
        return [(h, (slice(None), h)) for h in range(count)]
    if len(shape) >= 2 and shape[-1] % count == 0:
        width = shape[-1] // count
        return [(h, (Ellipsis, slice(h * width, (h + 1) * width))) for h in range(count)]
    raise InterventionError(f"per='head': {site.label} has shape {shape}: no axis of {count} heads and a last axis "
                            f"not divisible by {count}; name the attention output before its projection, or pass heads=N")


def check_per(per: Any, heads: Any) -> None:
    if per not in PER:
        raise InterventionError(f"per must be None, 'position' or 'head', got {per!r}")
    if heads is not None and (type(heads) is not int or heads < 1):
        raise InterventionError(f"heads must be a positive int (the number of attention heads), got {heads!r}")


def metric_value(metric: Callable[[Any], Any], outputs: Any) -> torch.Tensor:
    """`metric(outputs)` as a one-element tensor, or an error saying what it gave."""
    value = metric(outputs)
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        got = f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise InterventionError(f"metric(outputs) must return a scalar tensor (e.g. logits[0, -1, a] - logits[0, -1, b]); "
                                f"it returned {got}")
    return value.reshape(())


def rng_state() -> tuple:
    """The CPU generator's state, and the CUDA ones' when CUDA is initialised."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def set_rng_state(state: tuple) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state_all(state[1])


def _same_rng(a: tuple, b: tuple) -> bool:
    if not torch.equal(a[0], b[0]):
        return False
    return a[1] is None or b[1] is None or all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


class StateWatch:
    """What a model's run writes outside its arguments; `changes()` after the run lists it."""

    def __init__(self, model: Any):
        self.rng = rng_state()
        self.modules = list(model.modules()) if model is not None else []
        self.attributes = [dict(vars(m)) for m in self.modules]
        self.held = [(dict(m._parameters), dict(m._buffers), dict(m._modules)) for m in self.modules]
        self.versions = [(m, name, t, t._version) for m in self.modules
                         for name, t in (*m._parameters.items(), *m._buffers.items()) if t is not None]
        self.python = PythonState(model, held=True) if model is not None else None

    def running(self) -> Any:
        """Around the recorded run: also watch the globals of each module whose code the run reaches
        (`PythonState.watching_run`)."""
        return self.python.watching_run() if self.python is not None else contextlib.nullcontext()

    def changes(self) -> list[str]:
        out = []
        if not _same_rng(self.rng, rng_state()):
            out.append("the run drew random numbers (dropout in training mode?), so a skipped call would change "
                       "what the rest of the run draws")
        out += [f"{type(m).__name__}.{name} was written" for m, name, t, version in self.versions if t._version != version]
        for m, before, held in zip(self.modules, self.attributes, self.held):
            now = vars(m)
            if len(now) != len(before) or any(now.get(k, _MISSING) is not v for k, v in before.items()
                                              if not k.startswith(_HOOKS)):
                out.append(f"an attribute of {type(m).__name__} was set")
            for kind, items, live in zip(("parameter", "buffer", "child"), held, (m._parameters, m._buffers, m._modules)):
                if len(items) != len(live) or any(live.get(k, _MISSING) is not v for k, v in items.items()):
                    out.append(f"a {kind} of {type(m).__name__} was replaced")
        if self.python is not None:
            out += self.python.changed()
        return out


_MISSING = object()
_HOOKS = ("_forward", "_backward", "_state_dict", "_load_state_dict")  # hooks: the caller's, not the forward's state


DREW = "drew random numbers"  # what `function_watch` reports of a call that drew some


def function_watch(fn: Any) -> Callable[[], list]:
    """Before a call of `fn`: the check that lists, after it, what the call wrote outside its
    arguments (Python state it reaches, random numbers drawn)."""
    tracer = sys.gettrace()  # a run watched by `StateWatch.running`: its trace function skips this bookkeeping
    sys.settrace(None)
    try:
        python = PythonState.reached_by(fn)
    finally:
        sys.settrace(tracer)
    rng = rng_state()

    def wrote() -> list[str]:
        tracer = sys.gettrace()
        sys.settrace(None)
        try:
            out = python.changed()
        finally:
            sys.settrace(tracer)
        if not _same_rng(rng, rng_state()):
            out.append(DREW)
        return out

    return wrote
