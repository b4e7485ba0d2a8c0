"""nnschemaparser: a PyTorch module's forward as a readable, runnable schema.

The package root only re-exports. Pipeline: source -> lowering -> schema -> runtime (program,
interpreter) -> listeners (traces, stepping, comparison) -> views (dump, DataFrames, plots, widget, CLI).
The stages are subpackages (schema, lowering, runtime, parser, traces, inspection, files, store,
distributed, widget, validation, examples; docs/ARCHITECTURE.md); import a module from its stage
(`nnschemaparser.schema.errors`, not `nnschemaparser.errors`).
"""

from .inspection.capture import ModelCapture, capture_model
from .traces.sampling import CaptureLimits, TensorSnapshot
from .inspection.card import format_card
from .inspection.config_spec import ConfigFieldSpec, ModelStructureSpec, inspect_config
from .traces.compare import TraceDiff, compare_traces, diff_summary, first_divergence
from .traces.diverge import DivergeError, DivergeLine, DivergeReport, diverge
from .schema.dump import dump_schema, format_schema
from .schema.errors import (
    EditError,
    NNSchemaError,
    ParseError,
    SchemaFormatError,
    SchemaRunError,
    SourceUnavailableError,
    StaleSchemaError,
    UnsupportedSyntaxError,
)
from .traces.routing import moe_routing
from .files.file_format import (
    FileLimitError,
    FileLimits,
    FormatVersionError,
    MalformedFileError,
    ModelMismatchError,
    UnsafeReferenceError,
)
from .traces.frames import diffs_to_dataframe, tensor_statistics
from .traces.histograms import HistogramBins, histogram_bins, plot_histograms
from .inspection.flops import FlopMeter, count_forward_flops, count_parameters
from .inspection.graph_export import build_graph, write_graph
from .inspection.inspector import (GraphMismatchWarning, InputEdge, ModelInspector, ModuleCall, ModuleContext, ModuleInfo,
                                   OpInfo)
from .inspection.export_flow import GraphExportError
from .inspection.op_filter import PALETTIZABLE_OP_TYPES, QUANTIZABLE_OP_TYPES
from .runtime.interpreter import CallPause, SchemaInterpreter, StepInfo
from .runtime.interpreter import source_code
from .runtime.listeners import BlockEvent, CallEvent, EditEvent, InstructionEvent, TraceListener
from .inspection.metadata import ModelMetadata, ModuleMetadata, inspect_model
from .parser.model_parser import NNParser
from .traces.record import ExecutionRecord, capture_run
from .traces.interventions import Intervention, InterventionError, InterventionRun, Site
from .traces.patch_sites import PatchedRun
from .traces.patching import PatchingReuseWarning, activation_patching
from .traces.attribution import attribution_patching
from .traces.recorder import ActivationRecorder
from .traces.estimate import CaptureEstimate, CaptureTooLargeError, estimate_capture
from .traces.heap import HeapRetention, retain_freed_memory
from .traces.capture_memory import CaptureMemory, capture_memory_held, keep_capture_memory, release_capture_memory
from .traces.dropped import CaptureLimitWarning
from .traces.missed import KeepMissedWarning
from .traces.wrapped import KeepWrappedError
from .schema.model import (
    BlockInstruction,
    BlockRef,
    BreakInstruction,
    Const,
    ContinueInstruction,
    ControlInstruction,
    DeleteInstruction,
    FunctionInstruction,
    FunctionSchema,
    Instruction,
    ModelBlockSchema,
    OpInstruction,
    RaiseInstruction,
    ReturnInstruction,
    SliceOf,
    SourceLocation,
    TensorContainer,
    TensorRepr,
    TensorReprWithValue,
    TryInstruction,
    VarRef,
    WithInstruction,
    YieldInstruction,
)
from .files.schema_file import load_schema, save_schema
from .files.verification import SourceMismatchError
from .inspection.target import TargetError, load_target
from .files.trace_file import load_trace, save_trace
from .traces.trace import ActivationTrace, GradientTrace, TraceStep
from .files.value_codec import UnresolvedReference
from .traces.text_trace import TraceRecorder
from .traces.selection import KeepSelector, KeepTerm
from .store.dataset import capture_dataset
from .store.guard import StoreBusyError, StoreLinkError
from .store.manifest import StoreIncompleteError, StoreMismatchError
from .store.reader import TraceStore
from .store.reductions import Reduction
from .store.stacked import TokenBatches
from .distributed.collective import (CollectiveBreakpoint, CollectiveError, CollectiveRun, CollectiveTimeoutError,
                                     RankFailedError, RanksDivergedError, collective_step_run)
from .distributed.pipeline import PlacedEdit, SchemaStage, StageCapture
from .distributed.compare import compare_logical
from .distributed.diverge import diverge_logical
from .distributed.logical import LogicalCaptureError, LogicalTrace, capture_logical
from .distributed.sharded_dataset import capture_sharded_dataset
from .distributed.pipeline_dataset import capture_pipeline_dataset

__version__ = "0.1.0"

__all__ = [
    "NNParser", "SchemaInterpreter", "StepInfo", "CallPause", "TraceRecorder", "TraceListener", "BlockEvent",
    "InstructionEvent", "CallEvent", "dump_schema", "format_schema",
    "ModelBlockSchema", "FunctionSchema", "TensorRepr", "TensorReprWithValue", "TensorContainer", "VarRef",
    "BlockRef", "Const", "SliceOf", "SourceLocation", "Instruction", "OpInstruction", "BlockInstruction",
    "ControlInstruction", "TryInstruction", "WithInstruction", "FunctionInstruction", "RaiseInstruction",
    "DeleteInstruction", "YieldInstruction", "ReturnInstruction", "ContinueInstruction", "BreakInstruction",
    "NNSchemaError", "UnsupportedSyntaxError", "SourceUnavailableError", "ParseError", "SchemaRunError",
    "EditError", "SchemaFormatError", "StaleSchemaError", "moe_routing",
    "CaptureLimits", "ModelCapture", "TensorSnapshot", "capture_model", "ModelMetadata", "ModuleMetadata",
    "inspect_model", "ConfigFieldSpec", "ModelStructureSpec", "inspect_config",
    "ModelInspector", "OpInfo", "InputEdge", "ModuleContext", "ModuleInfo", "ModuleCall", "GraphExportError",
    "GraphMismatchWarning",
    "QUANTIZABLE_OP_TYPES", "PALETTIZABLE_OP_TYPES", "build_graph",
    "write_graph", "format_card", "FlopMeter", "count_forward_flops", "count_parameters", "TargetError",
    "load_target",
    "save_schema", "load_schema", "save_trace", "load_trace", "FileLimits", "MalformedFileError",
    "FormatVersionError", "FileLimitError", "UnsafeReferenceError", "ModelMismatchError", "SourceMismatchError", "UnresolvedReference",
    "ActivationRecorder", "ActivationTrace", "GradientTrace", "TraceStep", "ExecutionRecord", "capture_run",
    "Intervention", "InterventionError", "InterventionRun", "Site",
    "activation_patching", "attribution_patching", "PatchedRun", "PatchingReuseWarning",
    "TraceDiff", "compare_traces", "diff_summary", "first_divergence", "diffs_to_dataframe", "tensor_statistics",
    "diverge", "DivergeReport", "DivergeLine", "DivergeError",
    "HistogramBins", "histogram_bins", "plot_histograms", "EditEvent",
    "capture_dataset", "TraceStore", "Reduction", "KeepSelector", "KeepTerm", "StoreMismatchError",
    "StoreIncompleteError", "StoreBusyError", "StoreLinkError",
    "capture_logical", "LogicalTrace", "LogicalCaptureError", "compare_logical", "diverge_logical",
    "estimate_capture", "CaptureEstimate", "CaptureTooLargeError", "CaptureLimitWarning", "KeepMissedWarning",
    "KeepWrappedError", "TokenBatches", "retain_freed_memory", "HeapRetention",
    "release_capture_memory", "keep_capture_memory", "capture_memory_held", "CaptureMemory",
]

# torch.distributed: collective stepping across ranks, pipeline stages (nnschemaparser/distributed/)
__all__ += ["collective_step_run", "CollectiveRun", "CollectiveBreakpoint", "CollectiveError", "RankFailedError",
            "RanksDivergedError", "CollectiveTimeoutError", "SchemaStage", "StageCapture", "PlacedEdit",
            "capture_sharded_dataset", "capture_pipeline_dataset"]
