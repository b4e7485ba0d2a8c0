"""The distributed stage (after `store`, before `widget`): schemas run inside a `torch.distributed` group, seen as one model.

`placement` (a value's `Layout` on the device mesh: shard, replicate, partial sum, per mesh dim;
read off DTensors, tensor-parallel styles and FSDP2), `recorder` (`LogicalRecorder`: a capture that
derives each value's layout), `logical` (`capture_logical`, `LogicalTrace.logical`: gathering whole
values, a collective), `compare` (`compare_logical`: gathered values against one process); `diverge` and `diverge_shards`
(`diverge_logical`: one process against the sharded run by source statement, `nnschemaparser.diverge`'s
report with each row's carried and local error, a's values cut to each rank's part by placement);
`collective` (stepping, breakpoints and edits across ranks: `collective_step_run` gives every rank a
`CollectiveRun` whose every command is agreed by all ranks, a NaN on one rank stops them all, an
edit given in logical coordinates is sliced per rank, and a rank that raises ends the others with
`RankFailedError`), `collective_parts` (its breakpoints and the per-rank part of an edit),
`sharded_dataset` (`capture_sharded_dataset`: an activation store from a sharded model, every value
gathered whole on the fly and written by rank 0), `batch_rule` (a placement for an op DTensor cannot
run on a data-parallel batch shard, checked on the rank's rows), `pipeline` (a schema per
`torch.distributed.pipelining` stage: `SchemaStage` runs and captures its part, `PlacedEdit` edits
a value given for the whole batch), `pipeline_dataset` (`capture_pipeline_dataset`: an activation
store from a model split into pipeline stages, each stage's micro-batches joined into the batch's
rows, its block paths made the whole model's, written by rank 0).

May import: `schema`, `runtime`, `parser`, `traces`, `store`.
"""

from .compare import compare_logical
from .diverge import diverge_logical
from .logical import LogicalCaptureError, LogicalTrace, capture_logical
from .placement import DimPlacement, Layout
from .collective import (CollectiveBreakpoint, CollectiveError, CollectiveRun, CollectiveTimeoutError,
                         RankFailedError, RanksDivergedError, collective_step_run)
from .pipeline import PlacedEdit, SchemaStage, StageCapture
from .sharded_dataset import capture_sharded_dataset
from .pipeline_dataset import capture_pipeline_dataset

__all__ = ["capture_logical", "LogicalTrace", "LogicalCaptureError", "compare_logical", "diverge_logical", "Layout", "DimPlacement",
           "collective_step_run", "CollectiveRun", "CollectiveBreakpoint", "CollectiveError", "RankFailedError",
           "RanksDivergedError", "CollectiveTimeoutError", "SchemaStage", "StageCapture", "PlacedEdit",
           "capture_sharded_dataset", "capture_pipeline_dataset"]
