"""nnschemaparser: a PyTorch module's forward as a readable, runnable schema.

The package root only re-exports. Pipeline: source -> lowering -> schema -> engine/interpreter ->
listeners (traces, stepping, comparison) -> views (dump, DataFrames, plots, widget, CLI).
"""

from .capture import CaptureLimits, ModelCapture, TensorSnapshot, capture_model
from .card import format_card
from .compare import TraceDiff, compare_traces, diff_summary, first_divergence
from .dump import dump_schema, format_schema
from .errors import (
    EditError,
    NNSchemaError,
    ParseError,
    SchemaFormatError,
    SchemaRunError,
    SourceUnavailableError,
    UnsupportedSyntaxError,
)
from .file_format import (
    FileLimitError,
    FileLimits,
    FormatVersionError,
    MalformedFileError,
    ModelMismatchError,
    UnsafeReferenceError,
)
from .frames import diffs_to_dataframe, tensor_statistics
from .histograms import HistogramBins, histogram_bins, plot_histograms
from .flops import FlopMeter, count_forward_flops, count_parameters
from .graph_export import build_graph, write_graph
from .inspector import InputEdge, ModelInspector, ModuleCall, ModuleContext, ModuleInfo, OpInfo
from .interpreter import SchemaInterpreter, StepInfo
from .listeners import BlockEvent, EditEvent, InstructionEvent, TraceListener
from .metadata import ModelMetadata, ModuleMetadata, inspect_model
from .parser import NNParser
from .record import ExecutionRecord, capture_run
from .recorder import ActivationRecorder
from .schema import (
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
)
from .schema_file import load_schema, save_schema
from .target import TargetError, load_target
from .trace_file import load_trace, save_trace
from .traces import ActivationTrace, GradientTrace, TraceStep
from .value_codec import UnresolvedReference
from .text_trace import TraceRecorder

__version__ = "0.1.0"

__all__ = [
    "NNParser", "SchemaInterpreter", "StepInfo", "TraceRecorder", "TraceListener", "BlockEvent",
    "InstructionEvent", "dump_schema", "format_schema",
    "ModelBlockSchema", "FunctionSchema", "TensorRepr", "TensorReprWithValue", "TensorContainer", "VarRef",
    "BlockRef", "Const", "SliceOf", "SourceLocation", "Instruction", "OpInstruction", "BlockInstruction",
    "ControlInstruction", "TryInstruction", "WithInstruction", "FunctionInstruction", "RaiseInstruction",
    "DeleteInstruction", "ReturnInstruction", "ContinueInstruction", "BreakInstruction",
    "NNSchemaError", "UnsupportedSyntaxError", "SourceUnavailableError", "ParseError", "SchemaRunError",
    "EditError", "SchemaFormatError",
    "CaptureLimits", "ModelCapture", "TensorSnapshot", "capture_model", "ModelMetadata", "ModuleMetadata",
    "inspect_model",
    "ModelInspector", "OpInfo", "InputEdge", "ModuleContext", "ModuleInfo", "ModuleCall", "build_graph",
    "write_graph", "format_card", "FlopMeter", "count_forward_flops", "count_parameters", "TargetError",
    "load_target",
    "save_schema", "load_schema", "save_trace", "load_trace", "FileLimits", "MalformedFileError",
    "FormatVersionError", "FileLimitError", "UnsafeReferenceError", "ModelMismatchError", "UnresolvedReference",
    "ActivationRecorder", "ActivationTrace", "GradientTrace", "TraceStep", "ExecutionRecord", "capture_run",
    "TraceDiff", "compare_traces", "diff_summary", "first_divergence", "diffs_to_dataframe", "tensor_statistics",
    "HistogramBins", "histogram_bins", "plot_histograms", "EditEvent",
]
