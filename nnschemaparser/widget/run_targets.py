"""Where a run stands and what runs ran: the part of the inspector's state that a run owns.

`RunTargets` is a mixin of `InspectorState` (state.py) over its `runs`, `active`, `step_index`,
`pause`, `status`, `tree`, `breakpoints`, `reset()` and `_advance()`: dropping a run with its
breakpoint hits (`_forget_run`), the rows and blocks any run so far ran (`ran_nodes`, and the
blocks never entered / branches never taken for the tree), and a run-to whose target never came
(`_not_reached`: the run is replayed back to where it was, and the stop reason says why).

Depends on the widget's runs module only (no import of state.py: no import circle).
"""

from __future__ import annotations

from typing import Optional

from .runs import RunRecord

__all__ = ["RunTargets"]


class RunTargets:
    """Per-run bookkeeping of an InspectorState (see the module docstring)."""

    _dropped_entered: set[int]
    _dropped_executed: set[int]

    def _forget_run(self, record: RunRecord, keep_until: int = 0) -> None:
        """Drop a run that will never be shown again (abandoned, or the overshoot of a target not
        reached) with its breakpoint hits (but those up to step `keep_until`, which a replay keeps).
        Hits are keyed by the run's id (`run_id`), which no other run ever gets."""
        self.runs.remove(record)
        if record.finished:  # what it ran still counts for "did this row ever run"
            self._dropped_entered |= record.entered
            self._dropped_executed |= record.executed
        self.breakpoints.hits[:] = [hit for hit in self.breakpoints.hits
                                    if hit.get("run_id") != record.id or hit["step"] <= keep_until]

    def locate(self, run: "Optional[str | int]", trace_step: int) -> dict:
        """Where trace step `trace_step` of `run` was bound, for the view to go there (the tree row,
        its block's source and line, its source words); node -1 for an input of the run."""
        record = self.run(run)
        index = record.trace_index.get(int(trace_step))
        if not index:
            return {"node": -1, "source_block": -1, "line": 0, "label": "an input of the run"}
        row = record.step_row(index)
        node = row["node"]
        if node is None or node < 0:
            return {"node": -1, "source_block": -1, "line": row["line"], "label": row["block"]}
        tree = self.tree
        return {"node": node, "ancestors": tree.ancestors(node), "source_block": tree.block_of(node),
                "line": row["line"], "step_index": index,
                "label": f"{tree.source_words(node)} · {record.name} step {index}"}

    def any_finished(self) -> bool:
        """Whether some run has finished (one kept, or one dropped since): only then may a row that no
        run ran be said to have "never run"; before, it is "not run yet"."""
        return any(run.finished for run in self.runs) or bool(self._dropped_entered or self._dropped_executed)

    def ran_nodes(self) -> tuple[set[int], set[int]]:
        """(blocks entered, instruction rows executed) by any run so far, finished or not."""
        entered, executed = set(self._dropped_entered), set(self._dropped_executed)
        for run in self.runs:
            entered |= run.entered
            executed |= run.executed
        return entered, executed

    def _update_block_status(self) -> None:
        entered: set[int] = set(self._dropped_entered)
        executed: set[int] = set(self._dropped_executed)
        for run in self.runs:
            entered |= run.entered
            executed |= run.executed
        self._block_status = self.tree.block_status(entered, executed)
        self._untaken = self.tree.untaken_branches(entered, executed)

    def _place(self) -> tuple[int, bool]:
        """Where the run stands: (step index, paused before a call after it)."""
        return self.step_index, self.pause is not None

    def _not_reached(self, place: tuple[int, bool], target: str) -> None:
        """A run-to that ran off the end of the run: say so and go back to `place`, as if it never ran.

        The run that went past is dropped and the run is replayed (same edits, same random draws) to
        the step it was at, so the paused state is not lost; the run keeps its name and its id."""
        end, overshoot = self.step_index, self.active
        index, before_call = place
        self.reset()
        self._forget_run(overshoot, keep_until=index)
        self.active.name = overshoot.name
        self.active.id = overshoot.id  # the same run, replayed: its id and the hits kept stay with it
        while self.step_index < index and self._advance():
            pass
        if before_call and self.status == "paused":
            self._advance(stop_at_calls=True)
        self.stop_reason = f"target not reached: {target}; the run finished at step {end}" + (
            f", and is back at step {index}" if index else ", and is back at its start")
