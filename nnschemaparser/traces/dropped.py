"""What a capture's limits dropped: the table `ActivationTrace.dropped` and the summary `capture_run` warns with.

A value the limits did not keep is a step whose value is None and whose `omitted` text starts with
one of the recorder's limit reasons (`sampling.LIMIT_REASONS`: a quota that ran out, or evicted by
later values under `limit_policy="latest"`); the text survives a saved and loaded trace, so the
table of a loaded trace is the same.

Depends on torch, pandas (when a table is made) and sampling's reason texts.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

from .sampling import LIMIT_REASONS

__all__ = ["CaptureLimitWarning", "dropped_frame", "dropped_summary", "warn_dropped"]

_COLUMNS = ["step", "container_id", "block_path", "out_var", "shape", "dtype", "bytes", "reason"]


class CaptureLimitWarning(UserWarning):
    """A capture's CaptureLimits dropped values: the message says how many, where, and what to do."""


def _dtype_size(dtype: str) -> int:
    import torch

    found = getattr(torch, dtype.replace("torch.", ""), None)
    return torch.empty((), dtype=found).element_size() if isinstance(found, torch.dtype) else 0


def _dropped_steps(trace: Any) -> list:
    return [s for s in trace if s.value is None and s.omitted and s.omitted.startswith(LIMIT_REASONS)]


def dropped_frame(trace: Any):
    import pandas as pd

    rows = []
    for step in _dropped_steps(trace):
        shape = tuple(step.tensor.shape)
        rows.append({"step": step.step, "container_id": step.container_id, "block_path": step.block_path,
                     "out_var": step.out_var, "shape": list(shape), "dtype": step.tensor.dtype,
                     "bytes": math.prod(shape) * _dtype_size(step.tensor.dtype), "reason": step.omitted})
    return pd.DataFrame(rows, columns=_COLUMNS)


def dropped_summary(trace: Any, policy: str) -> str:
    """One line: how many values of how many the limits dropped, their bytes, the blocks, the fixes ('' if none)."""
    dropped = _dropped_steps(trace)
    if not dropped:
        return ""
    nbytes = sum(math.prod(s.tensor.shape) * _dtype_size(s.tensor.dtype) for s in dropped)
    blocks: list[str] = []
    for step in dropped:
        if step.block_path not in blocks:
            blocks.append(step.block_path)
    shown = ", ".join(b or "(inputs)" for b in blocks[:4]) + (f" and {len(blocks) - 4} more" if len(blocks) > 4 else "")
    other = "latest" if policy == "earliest" else "earliest"
    return (f"CaptureLimits dropped {len(dropped)} of {len(trace)} values ({nbytes} bytes; steps "
            f"{dropped[0].step}-{dropped[-1].step}; in {shown}), keeping the {policy} ones: trace.dropped lists them. "
            f"Keep what you need with keep='<block>:<variable>', raise max_bytes/max_tensors, or use "
            f"limit_policy='{other}'")


def warn_dropped(trace: Any, policy: str) -> None:
    summary = dropped_summary(trace, policy)
    if summary:
        warnings.warn(summary, CaptureLimitWarning, stacklevel=3)
