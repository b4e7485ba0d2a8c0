"""Exact activation patching: the metric with one site patched from the corrupted run, for every site.

    table = activation_patching(schema, clean, corrupted, metric, at="call=transformer.h.*", per="position")

`clean` and `corrupted` are scopes (what `SchemaInterpreter.run` takes), `metric(outputs)` gives a
scalar tensor from what the model returns. `at` is a selector (`keep=` grammar, `occurrence=`
allowed; traces/interventions.py): every tensor it names in the clean run is a site. For each site,
and each position or head when `per` asks (traces/patch_sites.py), the clean run is run again with
that part replaced by the corrupted run's value, an `Intervention` at `path:var occurrence=N`; the
row's `effect` is that metric minus the clean one, computed in the metric's dtype.

The table: `site` (`transformer.h.3:output` for what a call returns, `path:var#n` for the n-th
binding of a variable), `layer`, `position` / `head` when asked, `effect`, `metric` (the patched
metric) and `run`, a `PatchedRun` (the inputs and the one intervention: `run.outputs()` reproduces
the row, a view opens it as a fork). `table.attrs` holds `clean_metric`, `corrupted_metric`,
`reuse` ("on", or why it was off), the numbers of calls (block and function calls) `reused` and
`ran` over the sweep, and `unchanged`, the rows that made no run (below).

The clean prefix is not run again (runtime/reuse.py): the clean run records the block calls, and
the calls of Python functions (`create_causal_mask`), that the blocks holding sites make; in a
patched run, until the patch is applied, a call of the same block or function with bit-identical
arguments returns the recorded result. Reuse is turned off, with a `PatchingReuseWarning` naming
why, when the clean run wrote state a skipped call would not write again (parameters, buffers,
module attributes, module globals and class attributes of the model's code and of every module
whose code the clean run reached), drew random numbers (dropout in training mode), or made a
function call that wrote Python state it reaches (its module's globals, those of the functions it
names, their defaults and cells: `patch_sites.function_watch`). A function call that changed an
argument in place is not reused (the warning names it); the rest still is.

How deep the watch looks (parser/held_objects.py): a name rebound, and writes two levels into the
objects globals, class attributes, closure cells and defaults hold, each named in the warning:
`module.STATS.calls += 1`, `module.COUNTS[k] += 1` (a `defaultdict`), `module.CACHE[k] = v`,
`module.LOG.append(x)` (a list or a deque), `module.SEEN.add(x)`, `module.TABLES[k].append(x)`,
`module.STATE.cache[k] = v`, `module.TOTAL.add_(1)` (a tensor's version counter and data pointer), a
global `torch.Generator` drawn from. Not seen, so such a call is reused when its arguments match:
writes three levels in or deeper, into tuples, objects without a `__dict__` (`__slots__`, numpy
arrays, `random.Random`: Python's and numpy's random generators are not checked), through a module
object from another module's code (`m.STATE.x = 1`, seen only when the run called code of `m`
first),
into function objects (`fn.calls += 1`, an `lru_cache`'s table), `logging`'s objects, the standard
library's and torch's module state, and writes to files or the network. Pass `reuse=False` when the
model's code keeps state like that.

A site that is a block call's result (`call=`) is patched where the call returns, in a run of the
observed blocks compiled plain (`runtime.reuse.run_plain`: the call's number in the recording
returns the recorded result with the corrupted part in it, or the corrupted value): no observer,
no listener. Other sites, and a run that went another way before reaching the call, are patched by
an intervention in the observed run.

A part whose corrupted value has the clean value's bits (and strides), at a site whose value is no
view, makes no run while reuse is on: patching it would hand the run back its own value, so the
rest of the run is the clean run and the row's metric is the clean metric (positions before the
changed token, in a causal model). Every run starts from the random state the call found, which is
put back at the end. Runs are made under `torch.no_grad()`.

Depends on runtime.reuse, traces.interventions and traces.patch_sites; pandas.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Optional

import torch

from ..runtime.reuse import give_back_reuse, reuse_programs, run_plain, run_reusing
from ..runtime.reuse_values import bits_equal
from ..schema.errors import SchemaRunError
from ..schema.model import ModelBlockSchema
from .interventions import Intervention, InterventionRun
from .patch_sites import (DREW, PatchedRun, SiteValue, StateWatch, check_per, check_same_sites, function_watch,
                          look_at, metric_value, parts_of, rng_state, selector_of, set_rng_state)

__all__ = ["activation_patching", "PatchingReuseWarning"]


class PatchingReuseWarning(UserWarning):
    """Activation patching could not reuse the clean run's prefix (the reason is in the message)."""


def _check(schema: Any, clean: Any, corrupted: Any, metric: Any, function: str) -> None:
    if not isinstance(schema, ModelBlockSchema):
        raise SchemaRunError(f"{function} takes a ModelBlockSchema (from NNParser.parse_model), got {type(schema).__name__}")
    for name, scope in (("clean", clean), ("corrupted", corrupted)):
        if not isinstance(scope, dict):
            raise SchemaRunError(f"{function}: {name} must be a scope, a dict of input name -> value (as run takes), "
                                 f"got {type(scope).__name__}")
    if not callable(metric):
        raise SchemaRunError(f"{function}: metric must be a function of the model's outputs returning a scalar tensor")


def activation_patching(schema: ModelBlockSchema, clean: dict, corrupted: dict, metric: Callable[[Any], Any],
                        at: Any = None, per: Optional[str] = None, heads: Optional[int] = None, reuse: bool = True):
    """A DataFrame of the metric's change when each site `at` names is patched from `corrupted`.

    `per`: None (the whole value), "position" (axis 1) or "head" (`heads=` or read off the model;
    traces/patch_sites.py). `reuse=False` runs every patched run from the start (the same numbers).
    See the module docstring for the columns.
    """
    import pandas as pd

    _check(schema, clean, corrupted, metric, "activation_patching")
    check_per(per, heads)
    item = selector_of(at, "activation_patching")
    observe = InterventionRun(schema, [item]).observe
    pair = reuse_programs(schema, observe)
    state = rng_state()
    rows: list[dict] = []
    try:
        with torch.no_grad():
            watch = StateWatch(schema.module) if reuse else None
            pair.reuse.start("record" if reuse else "off")
            pair.reuse.watch = function_watch if reuse else None
            clean_sites: list[SiteValue] = []
            calls: list = []  # the number of the recorded block call each site is the result of (or None)

            def number(value: torch.Tensor, site: Any) -> torch.Tensor:
                # the call that just returned this very value (a call not made through the recording has none)
                made = site.call is not None and pair.reuse.returned_value is value
                calls.append(pair.reuse.returned if made else None)
                pair.reuse.returned_value = None
                return value

            with watch.running() if reuse else contextlib.nullcontext():
                clean_outputs = run_reusing(pair, schema, clean, look_at(item, clean_sites, number, copy=reuse))
            clean_metric = metric_value(metric, clean_outputs)
            why = _why_not(watch, pair.reuse) if reuse else ["reuse=False"]
            if why and reuse:
                warnings.warn(PatchingReuseWarning(
                    "activation_patching reruns every patched run from the start: " + "; ".join(why[:3])), stacklevel=2)
            elif reuse and pair.reuse.changed_arguments:
                warnings.warn(PatchingReuseWarning(
                    "activation_patching runs these function calls again in every patched run, since each changed an "
                    "argument in place: " + ", ".join(dict.fromkeys(pair.reuse.changed_arguments))), stacklevel=2)
            set_rng_state(state)
            pair.reuse.start("off")
            sites: list[SiteValue] = []
            corrupted_metric = metric_value(metric, run_reusing(pair, schema, corrupted, look_at(item, sites, copy=True)))
            check_same_sites(clean_sites, sites)
            reused = ran = unchanged = 0
            for site, clean_site, call in zip(sites, clean_sites, calls):
                for number, index in parts_of(schema, site, per, heads):
                    part = site.bound if index is None else site.bound[index]
                    if not why and _unchanged(clean_site, part, index):
                        patched, unchanged = clean_metric, unchanged + 1  # the patched run is the clean run
                    else:
                        done = False
                        if not why and call is not None:  # patched where the call returns: no observer
                            set_rng_state(state)
                            pair.reuse.start("replay", _holding(site), call, _replacing(part, index))
                            outputs = run_plain(pair, clean)
                            done = pair.reuse.patched  # else the run went another way before the site
                            reused, ran = reused + pair.reuse.reused, ran + pair.reuse.ran
                        if not done:
                            set_rng_state(state)
                            pair.reuse.start("off" if why else "replay", _holding(site))
                            outputs = run_reusing(pair, schema, clean, [_patch(pair.reuse, site, part, index)])
                            reused, ran = reused + pair.reuse.reused, ran + pair.reuse.ran
                        patched = metric_value(metric, outputs)
                    row = {"site": site.label, "layer": site.layer}
                    if per is not None:
                        row[per] = number
                    row["effect"] = (patched - clean_metric).item()
                    row["metric"] = patched.item()
                    row["run"] = PatchedRun(schema, clean, [Intervention(site.selector, part, index=index,
                                                                         occurrence=site.occurrence)], site.label)
                    rows.append(row)
    finally:
        give_back_reuse(pair)
        set_rng_state(state)
    table = pd.DataFrame(rows, columns=["site", "layer", *([per] if per else []), "effect", "metric", "run"])
    table["layer"] = table["layer"].astype("Int64")  # None where the site's path has no layer number
    table.attrs.update(clean_metric=clean_metric.item(), corrupted_metric=corrupted_metric.item(),
                       reuse="on" if not why else "off: " + "; ".join(why), reused=reused, ran=ran, unchanged=unchanged)
    return table


def _why_not(watch: StateWatch, reuse: Any) -> list[str]:
    """Why the recorded clean run cannot be reused: state it wrote, and each function call that wrote some."""
    out = watch.changes()
    for name, wrote in reuse.impure:
        written = [w for w in wrote if w != DREW]
        if written:
            out.append(f"{name} wrote state ({'; '.join(written[:2])})")
        if DREW in wrote:
            out.append(f"{name} {DREW}")
    return out


def _unchanged(clean: SiteValue, part: torch.Tensor, index: Any) -> bool:
    """Whether patching `part` in leaves the clean run as it was: the clean value's part has the same
    bits, strides and type, and the value is no view (the patch, a new tensor, would share storage
    with nothing, where the clean value shares its base's)."""
    value = clean.bound
    return (isinstance(clean.value, torch.Tensor) and clean.value._base is None
            and bits_equal(part, value if index is None else value[index]))


def _replacing(part: torch.Tensor, index: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """What a patched call returns instead of its result: `part`, or the result with `part` at `index`
    (as the intervention writes it, traces/interventions.py)."""
    if index is None:
        return lambda result: part

    def replace(result: torch.Tensor) -> torch.Tensor:
        whole = result.clone()
        whole[index] = part
        return whole

    return replace


def _holding(site: SiteValue) -> Callable[[ModelBlockSchema], bool]:
    """Whether a block holds the site (a call of it must run for the patch to be applied)."""
    path = site.path

    def holds(block: ModelBlockSchema) -> bool:
        own = block.path
        return not own or path == own or path.startswith(own + ".")

    return holds


def _patch(reuse: Any, site: SiteValue, part: torch.Tensor, index: Any) -> Intervention:
    """The site's intervention, telling `reuse` the patch is applied (from then on every call runs)."""
    def put(value: torch.Tensor, where: Any) -> torch.Tensor:
        reuse.fired = True
        return part

    return Intervention(site.selector, put, index=index, occurrence=site.occurrence)

