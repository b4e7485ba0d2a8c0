"""The distributed stage (after `store`, before `widget`): sharded runs under torch.distributed seen as one model.

`placement` (a value's `Layout` on the device mesh: shard, replicate, partial sum, per mesh dim;
read off DTensors, tensor-parallel styles and FSDP2), `recorder` (`LogicalRecorder`: a capture that
derives each value's layout), `logical` (`capture_logical`, `LogicalTrace.logical`: gathering whole
values, a collective), `compare` (`compare_logical`: gathered values against one process).

May import: `schema`, `runtime`, `parser`, `traces`.
"""

from .compare import compare_logical
from .logical import LogicalCaptureError, LogicalTrace, capture_logical
from .placement import DimPlacement, Layout

__all__ = ["capture_logical", "LogicalTrace", "LogicalCaptureError", "compare_logical", "Layout", "DimPlacement"]
