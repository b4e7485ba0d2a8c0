"""The per-run history of captured tensors: `TraceStep`, `ActivationTrace` and `GradientTrace`.

A trace is a plain, disposable artifact: one `TraceStep` per captured tensor in chronological order,
each carrying a `TensorContainer` (shape, dtype, detached value) under a stable container id. The
schema is never touched by a trace; one schema serves any number of runs.

Container ids: `input_NNNN` and `output_NNNN` for the root's inputs and outputs, `{block_path}_NNNN`
for everything in between (dots of the path become underscores; the root's path is its class name),
`grad_` + the activation id for gradients. NNNN is the 1-based step number, zero-padded to 4.

Depends on schema and `tables` (pandas is imported only when a frame is built).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from ..schema.model import TensorContainer
from .tables import trace_to_dataframe, write_parquet

__all__ = ["TraceStep", "ActivationTrace", "GradientTrace", "container_id"]


def container_id(prefix: str, step: int) -> str:
    """`fc1_0002` from ("fc1", 2); `layers.0` becomes `layers_0`."""
    return f"{prefix.replace('.', '_')}_{step:04d}"


@dataclass(eq=False, slots=True)
class TraceStep:
    """One captured tensor of a run.

    `tensor.value` is a detached tensor holding the value at capture time, or None when a capture
    limit or a missing gradient left it out; `omitted` then says why and `sample` may hold its
    first elements. `source_container_id` is set on gradient steps only. `edited` marks a step whose
    value a stepped run's edit replaced right after it was produced: the trace then holds the value
    the rest of the run saw.
    """

    step: int
    container_id: str
    description: str
    slot_type: str
    out_var: str
    op_name: str
    block_path: str
    tensor: TensorContainer
    source_container_id: Optional[str] = None
    frame_depth: int = 0
    omitted: Optional[str] = None
    sample: tuple = ()
    edited: bool = False

    @property
    def value(self) -> Any:
        """Shortcut for `tensor.value`."""
        return self.tensor.value

    def line(self) -> str:
        """The step as one line of a saved trace."""
        parts = [f"step {self.step:04d}: {self.description}", f"container_id: {self.container_id}",
                 self.tensor.describe()]
        if self.out_var:
            parts.append(f"var: {self.out_var}")
        if self.block_path:
            parts.append(f"block: {self.block_path}")
        if self.source_container_id:
            parts.append(f"source: {self.source_container_id}")
        if self.edited:
            parts.append("edited")
        if self.omitted:
            parts.append(f"value omitted: {self.omitted}")
        return " | ".join(parts)


class _Trace:
    """Shared behaviour of activation and gradient traces: lookup, iteration, text, frames."""

    kind = "trace"

    def __init__(self, steps: Optional[list[TraceStep]] = None, root: str = ""):
        self._steps: list[TraceStep] = list(steps or [])
        # Steps a recorder wrote as bare records, built into TraceSteps by `_build` when first read
        # (see ActivationRecorder): a run then pays for a list per tensor, not for two dataclasses.
        self._pending: list[list] = []
        self._build: Optional[Callable[[list[list]], list[TraceStep]]] = None
        self.root = root
        self._index: Optional[dict[str, TraceStep]] = None

    @property
    def steps(self) -> list[TraceStep]:
        """The TraceSteps in chronological order (records still pending are built first)."""
        if self._pending:
            self._flush()
        return self._steps

    @steps.setter
    def steps(self, steps: list[TraceStep]) -> None:
        self._pending.clear()
        self._steps = steps

    def _flush(self) -> None:
        pending = self.pending_records()
        self._steps.extend(self._build(pending))  # type: ignore[misc]
        pending.clear()  # in place: the recorder appends to this very list

    def pending_records(self) -> list[list]:
        """The records not built into TraceSteps yet, a logged run's span expanded into its records
        (traces/logged.py; in place, so the list stays the recorder's)."""
        pending = self._pending
        if any(type(item) is not list for item in pending):
            records: list[list] = []
            for item in pending:
                if type(item) is list:
                    records.append(item)
                else:
                    records.extend(item.records())
            pending[:] = records
        return pending

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_steps"], state["_pending"], state["_build"] = self.steps, [], None
        return state

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[TraceStep]:
        return iter(self.steps)

    def __getitem__(self, index: int) -> TraceStep:
        return self.steps[index]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self.root or 'a run'}: {len(self.steps)} steps>"

    @property
    def container_ids(self) -> list[str]:
        return [step.container_id for step in self.steps]

    def append(self, step: TraceStep) -> None:
        self.steps.append(step)
        if self._index is not None:
            self._index[step.container_id] = step

    def by_container(self, container_id: str) -> TraceStep:
        """The step holding `container_id`; a KeyError names close ids when there is none."""
        if self._index is None or len(self._index) != len(self.steps):
            self._index = {step.container_id: step for step in self.steps}
        step = self._index.get(container_id)
        if step is None:
            close = difflib.get_close_matches(str(container_id), list(self._index), n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else \
                f"; this {self.kind} has {len(self.steps)} steps"
            raise KeyError(f"no step with container id {container_id!r} in this {self.kind}{hint}")
        return step

    def __contains__(self, container_id: object) -> bool:
        try:
            self.by_container(container_id)  # type: ignore[arg-type]
        except KeyError:
            return False
        return True

    def lines(self) -> list[str]:
        return [step.line() for step in self.steps]

    def save(self, path: str | Path) -> Path:
        """Write one line per step (`step 0002: Linear projection | container_id: fc1_0002 | ...`)."""
        path = Path(path)
        path.write_text("\n".join(self.lines()) + "\n")
        return path

    def to_dataframe(self) -> Any:
        """One row per step with its metadata and value statistics (needs pandas)."""
        return trace_to_dataframe(self)

    def to_parquet(self, path: str | Path) -> Path:
        """Write `to_dataframe()` as Parquet (needs pandas and pyarrow)."""
        return write_parquet(self.to_dataframe(), path)


class ActivationTrace(_Trace):
    """The tensors of one run, in the order they were produced."""

    kind = "activation trace"

    @property
    def dropped(self) -> Any:
        """The values `CaptureLimits` dropped (a DataFrame, empty when none): step, container_id,
        block_path, out_var, shape, dtype, bytes and reason, in step order (traces/dropped.py)."""
        from .dropped import dropped_frame

        return dropped_frame(self)


class GradientTrace(_Trace):
    """The gradients of a run's captured tensors, mirroring its activation steps in the same order.

    Each step's `container_id` is the activation id prefixed with `grad_`; `source_container_id`
    points back to the activation step; `step` keeps the activation step number.
    """

    kind = "gradient trace"

    def for_activation(self, container_id: str) -> TraceStep:
        """The gradient step of the activation `container_id`."""
        return self.by_container("grad_" + container_id)

