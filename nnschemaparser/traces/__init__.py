"""Stage 5, runs as data: listeners that record what a run computed, and views of those records.

`text_trace` (the chronological text trace), `sampling` (bounded samples of tensors:
`CaptureLimits`, `TensorSnapshot`), `descriptions` (a phrase per op), `tables` (per-step statistics,
pandas), `trace` (`ActivationTrace`, `GradientTrace`, `TraceStep`), `recorder` (`ActivationRecorder`:
values at capture time, gradient hooks), `record` (`capture_run`, through a logged program, `logged`,
with a `keep=` selector compiled into it by `keep_plan`), `compare` (`compare_traces`), `frames` (diff
DataFrames), `histograms` (bins and figures), `interventions` (`interventions=`:
selectors and the listener that replaces values; imported here so the runtime can read them),
`steering` (`steer`, `attach`: steering vectors and SAEs as interventions), `patch_sites` (the sites,
parts and state checks patching shares), `patching` (`activation_patching`), `attribution`
(`attribution_patching`), `diverge` (two configurations compared by source statement: `diverge_align`
pairs statements, `diverge_runs` the runs and their listener, `diverge_bounds` the errors and what a
dtype explains, `diverge_native` their common case in C), `diverge_compile` (where a `torch.compile`d model parts from eager: regions of the
generated code compiled with its backend, `compile_regions`, bounded by `compile_bound`), `heap` (`retain_freed_memory`: glibc's malloc keeps what a dropped
capture freed, for the next one, process-wide), `capture_memory` (the capture-owned, bounded
alternative on by default: a block pinned at the heap's top, `release_capture_memory`).

May import: `schema`, `runtime` (listener interface, interpreter), `parser`.
"""

from . import interventions as _interventions  # noqa: F401  (gives the runtime `interventions=`)
from .trace import ActivationTrace, GradientTrace, TraceStep, container_id  # the old `nnschemaparser.traces` names

__all__ = ["TraceStep", "ActivationTrace", "GradientTrace", "container_id"]
