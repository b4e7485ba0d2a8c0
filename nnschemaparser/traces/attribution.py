"""Attribution patching: activation patching's effects estimated to first order, for every site at once.

    table = attribution_patching(schema, clean, corrupted, metric, at="call=transformer.h.*", per="position")

One corrupted forward (no gradient) keeps the value of every site `at` names; one clean forward and
one backward give the metric's gradient at each site. A row's `attribution` is
`(grad * (corrupted - clean))` summed over the axes the row does not index: all of them for
`per=None`, all but the position (axis 1, `[:, p]`) for `per="position"`, all but the head's part for
`per="head"` (traces/patch_sites.py says how the head axis is found). It estimates the row's
`effect` in `activation_patching` (the metric's change when that part is patched).

Every site gets a gradient, whatever its block: the clean run goes through `interventions=` at the
selector, and at each site the value is kept as the gradient's target: the bound tensor itself when
it requires grad (its gradient is read with `torch.autograd.grad`, so nothing is accumulated into
the parameters' `.grad`), or, when nothing upstream requires grad (frozen weights, an input), the
same tensor detached and made to require grad (the same bits; the run's outputs are unchanged).
A site changed in place later in the run is read through a tensor hook registered when it was
bound, which receives the gradient of the value as bound (as the recorder's gradients do). A site
whose value is not floating point (token ids, masks) has no gradient: its rows are NaN, and a
`UserWarning` names them. A site the metric does not depend on gets zeros.

The table: `site`, `layer`, `position` / `head` when asked, `attribution`; `table.attrs` holds
`clean_metric` and `corrupted_metric`.

Depends on runtime.reuse (the pair of programs it runs through), traces.interventions and
traces.patch_sites; pandas.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Optional

import torch

from ..runtime.reuse import give_back_reuse, reuse_programs, run_reusing
from ..schema.model import ModelBlockSchema
from .interventions import InterventionRun, Site
from .patch_sites import (SiteValue, check_per, check_same_sites, look_at, metric_value, parts_of, rng_state,
                          selector_of, set_rng_state)
from .patching import _check

__all__ = ["attribution_patching"]


class _Targets:
    """The clean run's site values as gradient targets (see the module docstring)."""

    def __init__(self) -> None:
        self.versions: dict[int, int] = {}
        self.hooked: dict[int, list] = {}

    def make(self, value: torch.Tensor, site: Site) -> torch.Tensor:
        if not (value.is_floating_point() or value.is_complex()):
            return value
        target = value if value.requires_grad else value.detach().requires_grad_(True)
        if id(target) not in self.versions:
            self.versions[id(target)] = target._version
            caught: list = []
            self.hooked[id(target)] = caught
            target.register_hook(lambda grad, _caught=caught: _caught.append(grad.detach()))
        return target


def attribution_patching(schema: ModelBlockSchema, clean: dict, corrupted: dict, metric: Callable[[Any], Any],
                         at: Any = None, per: Optional[str] = None, heads: Optional[int] = None):
    """A DataFrame of grad x (corrupted - clean) at each site `at` names (see the module docstring)."""
    import pandas as pd

    _check(schema, clean, corrupted, metric, "attribution_patching")
    check_per(per, heads)
    item = selector_of(at, "attribution_patching")
    pair = reuse_programs(schema, InterventionRun(schema, [item]).observe)
    state = rng_state()
    try:
        with torch.no_grad():
            sites: list[SiteValue] = []
            corrupted_metric = metric_value(metric, run_reusing(pair, schema, corrupted, look_at(item, sites, copy=True)))
        set_rng_state(state)
        targets = _Targets()
        clean_sites: list[SiteValue] = []
        with torch.enable_grad():
            clean_metric = metric_value(metric, run_reusing(pair, schema, clean, look_at(item, clean_sites, targets.make, copy=True)))
            check_same_sites(clean_sites, sites)
            grads = _gradients(clean_metric, clean_sites, targets, schema.module)
    finally:
        give_back_reuse(pair)
        set_rng_state(state)
    rows: list[dict] = []
    no_gradient: list[str] = []
    with torch.no_grad():
        for site, other, grad in zip(clean_sites, sites, grads):
            if grad is None:
                no_gradient.append(site.label)
            else:
                product = grad * (other.bound - site.bound)
            for number, index in parts_of(schema, site, per, heads):
                row = {"site": site.label, "layer": site.layer}
                if per is not None:
                    row[per] = number
                if grad is None:
                    row["attribution"] = float("nan")
                else:
                    row["attribution"] = (product if index is None else product[index]).sum().item()
                rows.append(row)
    if no_gradient:
        warnings.warn(f"attribution_patching: {len(no_gradient)} site(s) hold no floating-point value and have no "
                      f"gradient (their rows are NaN): {', '.join(no_gradient[:5])}", stacklevel=2)
    table = pd.DataFrame(rows, columns=["site", "layer", *([per] if per else []), "attribution"])
    table["layer"] = table["layer"].astype("Int64")
    table.attrs.update(clean_metric=clean_metric.item(), corrupted_metric=corrupted_metric.item())
    return table


def _gradients(metric: torch.Tensor, sites: list[SiteValue], targets: _Targets, module: Any) -> list:
    """The metric's gradient at each site (None where the value is not floating point)."""
    wanted = [s.value for s in sites if id(s.value) in targets.versions]
    changed = any(t._version != targets.versions[id(t)] for t in wanted)
    direct = [t for t in {id(t): t for t in wanted}.values() if t._version == targets.versions[id(t)]]
    found: dict[int, torch.Tensor] = {}
    if metric.requires_grad and wanted:
        inputs = list(direct)
        if changed and module is not None:  # reach the values as bound, upstream of their in-place change
            seen = {id(t) for t in inputs}
            inputs += [p for p in module.parameters() if p.requires_grad and id(p) not in seen]
        grads = torch.autograd.grad(metric, inputs, allow_unused=True)
        found = {id(t): g for t, g in zip(inputs, grads)}
    out = []
    for s in sites:
        key = id(s.value)
        if key not in targets.versions:
            out.append(None)
        elif s.value._version == targets.versions[key] and found.get(key) is not None:
            out.append(found[key])
        else:
            caught = targets.hooked[key]
            out.append(sum(caught[1:], caught[0]) if caught else torch.zeros_like(s.value))
    return out

