"""The distributed stage (after `store`, before `widget`): schemas run inside a `torch.distributed` group, seen as one model.

`collective` (stepping, breakpoints and edits across ranks: `collective_step_run` gives every rank a
`CollectiveRun` whose every command is agreed by all ranks, a NaN on one rank stops them all, an
edit given in logical coordinates is sliced per rank, and a rank that raises ends the others with
`RankFailedError`), `collective_parts` (its breakpoints and the per-rank part of an edit),
`pipeline` (a schema per `torch.distributed.pipelining` stage: `SchemaStage`
runs and captures its part, `PlacedEdit` edits a value given for the whole batch).

May import: `schema`, `runtime`, `parser`, `traces`.
"""

from .collective import (CollectiveBreakpoint, CollectiveError, CollectiveRun, CollectiveTimeoutError,
                         RankFailedError, RanksDivergedError, collective_step_run)
from .pipeline import PlacedEdit, SchemaStage, StageCapture

__all__ = ["collective_step_run", "CollectiveRun", "CollectiveBreakpoint", "CollectiveError", "RankFailedError",
           "RanksDivergedError", "CollectiveTimeoutError", "SchemaStage", "StageCapture", "PlacedEdit"]
