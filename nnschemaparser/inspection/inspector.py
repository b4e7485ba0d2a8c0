"""ModelInspector: parse a model once, run its schema once, and answer questions about its ops.

The inspector is the facade of the inspection layer. On construction it parses the model
(`NNParser.parse_model`), then runs the schema once with a `DataFlowRecorder` and a `FlopMeter`
attached, under `torch.no_grad()` (autograd enabled with `autograd=True`) and with the model's state put back afterwards. From that one run
it knows every op (module-qualified name, type, inputs by producer and slot, states, consumers,
source variable, shape, file:line and FLOPs) and every module's boundary. Queries select ops the way
a compression config would: op types by exact string, op and module names/types by a full-match
regular expression.

Two execution modes: "eager" (the default) is the schema run above, with module-qualified op names
(`linear1.linear`); "graph" exports the model with `torch.export` and walks the FX graph
(`export_flow`), with the graph's global op names (`linear`, `linear_1`); `schema` is then None,
`exported` holds the ExportedProgram, and `eager_mismatch` says how the graph's result differs from
the eager forward's (None when bit for bit equal; a `GraphMismatchWarning` is issued otherwise). `compressor=` keeps only the ops a compressor can act on
(`op_filter`): a set of op types or an object with a registry of them; module records and every
edge stay, so connectivity through a filtered op still names it.

Depends on parser, interpreter, connectivity, dataflow, flops, metadata and summary; never on the CLI.
"""

from __future__ import annotations

import inspect
import re
import warnings
from typing import Any, Mapping, Optional, Sequence

import torch
from torch import nn

from .connectivity import DataFlowRecorder
from .dataflow import DataFlow, InputEdge, ModuleCall, ModuleContext, ModuleInfo, OpInfo
from .export_flow import export_flow
from .op_filter import op_types_of
from .flops import FlopMeter, block_parameter_counts, count_parameters
from ..runtime.interpreter import SchemaInterpreter
from ..runtime.listeners import TraceListener
from .metadata import ModelMetadata, inspect_model
from ..parser.equality import Mismatch
from ..parser.model_parser import NNParser, preserved_state
from ..schema.model import ModelBlockSchema
from .summary import format_summary

__all__ = ["ModelInspector", "OpInfo", "InputEdge", "ModuleContext", "ModuleInfo", "ModuleCall", "GraphMismatchWarning"]


class GraphMismatchWarning(UserWarning):
    """Graph mode: the exported program's result is not bit for bit the eager forward's."""


def _forward_inputs(model: nn.Module, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Name the example inputs after the forward's parameters, as the schema's scope wants them."""
    try:
        signature = inspect.signature(model.forward)
    except (TypeError, ValueError):
        signature = None
    if signature is None:
        if args:
            raise TypeError(f"cannot read the signature of {type(model).__name__}.forward to name the positional "
                            "inputs; pass them by name with example_kwargs={'name': value}")
        return dict(kwargs)
    positional = [p.name for p in signature.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(args) > len(positional):
        raise TypeError(f"{type(model).__name__}.forward takes {len(positional)} positional inputs "
                        f"({', '.join(positional) or 'none'}) but example_inputs has {len(args)}; pass the extra "
                        "ones by name in example_kwargs")
    named = dict(zip(positional, args))
    for key, value in kwargs.items():
        if key in named:
            raise TypeError(f"input {key!r} is given both positionally and in example_kwargs; give it once")
        named[key] = value
    return named


def _fresh(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in values.items()}


def _pattern(pattern: str, what: str) -> re.Pattern:
    if not isinstance(pattern, str):
        raise TypeError(f"the {what} pattern must be a string, got {type(pattern).__name__}")
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{pattern!r} is not a valid regular expression for a {what} ({exc}); "
                         f"escape literal characters with re.escape({pattern!r})") from None


class ModelInspector:
    """One model, parsed and run once on example inputs, seen as ops and modules.

    `example_inputs` are the forward's positional inputs, `example_kwargs` its keyword inputs.
    `execution_mode` is "eager" (the schema run; the default) or "graph" (`torch.export`).
    `compressor` is None (all ops), a set of op types such as QUANTIZABLE_OP_TYPES, or an object
    with a registry of op types (see `op_filter`); it filters `ops`, the queries and the summary.
    `listeners` are extra TraceListeners attached to the eager inspection run (a TraceRecorder, say).
    The model's parameters, buffers, training flags and RNG are the same afterwards.
    `autograd=True` records the eager run with autograd enabled (the CLI's trace, as neurarch-trace
    runs it) instead of under `torch.no_grad()`; the values are the same bit for bit either way.
    """

    def __init__(self, model: nn.Module, example_inputs: Sequence[Any] = (),
                 example_kwargs: Optional[Mapping[str, Any]] = None, *,
                 execution_mode: str = "eager", compressor: Any = None,
                 listeners: Sequence[TraceListener] = (), autograd: bool = False) -> None:
        if not isinstance(model, nn.Module):
            if isinstance(model, type) and issubclass(model, nn.Module):
                raise TypeError(f"ModelInspector needs a module instance, got the class {model.__name__}; "
                                f"construct it first: ModelInspector({model.__name__}(...), example_inputs=...)")
            raise TypeError(f"ModelInspector needs an nn.Module instance, got {type(model).__name__}")
        if isinstance(example_inputs, (torch.Tensor, Mapping)) or not isinstance(example_inputs, Sequence):
            raise TypeError("example_inputs must be a tuple of the forward's positional inputs, e.g. "
                            "example_inputs=(torch.randn(1, 10),); pass keyword inputs in example_kwargs")
        if execution_mode not in ("eager", "graph"):
            raise ValueError(f"execution_mode must be 'eager' or 'graph', got {execution_mode!r}")
        op_types = op_types_of(compressor)
        self.model = model
        self.execution_mode = execution_mode
        self.autograd = bool(autograd)
        self.op_types = op_types
        self.inputs = _forward_inputs(model, tuple(example_inputs), dict(example_kwargs or {}))
        self.schema: Optional[ModelBlockSchema] = None
        self.exported: Any = None
        self.eager_mismatch: Optional[Mismatch] = None
        if execution_mode == "graph":
            if listeners:
                raise ValueError("listeners observe the schema run of execution_mode='eager'; graph mode runs the "
                                 "exported program: drop listeners or use eager mode")
            flow, self.exported, self.eager_mismatch = export_flow(model, tuple(example_inputs),
                                                                   dict(example_kwargs or {}))
            if self.eager_mismatch is not None:
                warnings.warn(f"the exported graph of {type(model).__name__} does not compute what its eager forward "
                              f"computes ({self.eager_mismatch}): torch.export decomposed some module differently, so "
                              "the graph's ops, FLOPs and result are the graph's own; execution_mode='eager' "
                              "inspects the forward as it runs", GraphMismatchWarning, stacklevel=2)
        else:
            self.schema = NNParser.parse_model(model, inputs_tensors_values=self.inputs, grad_free=False)
            flow = self._observe(listeners)
        self._all = flow
        self._flow = flow.filtered(op_types)

    def _observe(self, listeners: Sequence[TraceListener]) -> DataFlow:
        meter = FlopMeter()
        recorder = DataFlowRecorder(self.model, flop_meter=meter.read)
        interpreter = SchemaInterpreter(listeners=recorder.listeners(listeners))
        scope = _fresh(self.inputs)
        with preserved_state(self.model), torch.set_grad_enabled(self.autograd), meter, recorder.watching():
            interpreter.run(self.schema, scope)
        return recorder.result()

    # -- what the run saw ---------------------------------------------------------------------

    @property
    def ops(self) -> tuple[OpInfo, ...]:
        """Every op of the run, in execution order."""
        return self._flow.ops

    @property
    def modules(self) -> dict[str, ModuleInfo]:
        """Every module of the schema tree by path ("" for the root), with its boundary."""
        return self._flow.modules

    @property
    def calls(self) -> tuple[ModuleCall, ...]:
        """Every module call of the run, in entry order."""
        return self._flow.calls

    @property
    def flow(self) -> DataFlow:
        """The records of the run, filtered by `compressor` (`unfiltered_flow` keeps every op)."""
        return self._flow

    @property
    def unfiltered_flow(self) -> DataFlow:
        return self._all

    @property
    def result(self) -> Any:
        """What the schema's forward returned in the inspection run."""
        return self._flow.result

    @property
    def total_flops(self) -> int:
        """FLOPs of the run as FlopCounterMode counted them, all charged to ops."""
        return self._flow.total_flops

    @property
    def total_parameters(self) -> int:
        """Elements of every parameter of the model, tied weights once."""
        return count_parameters(self.model)

    def block_parameters(self) -> dict[str, int]:
        """Parameters of each registered module's subtree, by path ("" for the root), tied weights once."""
        return block_parameter_counts(self.model)

    def metadata(self) -> ModelMetadata:
        """The registered-state records of `inspect_model` (no forward pass)."""
        return inspect_model(self.model)

    def op(self, op_name: str) -> OpInfo:
        """The op called `op_name`; KeyError lists close names when there is none."""
        for op in self._flow.ops:
            if op.op_name == op_name:
                return op
        known = ", ".join(op.op_name for op in self._flow.ops[:20])
        raise KeyError(f"no op named {op_name!r}; ops include: {known or '(none)'}")

    # -- queries ------------------------------------------------------------------------------

    def get_matched_ops_for_op_type(self, op_type: str) -> tuple[OpInfo, ...]:
        """Ops whose type is exactly `op_type` ("linear", "add", "LSTM" for an eagerly run child)."""
        if not isinstance(op_type, str):
            raise TypeError(f"op_type must be a string such as 'linear', got {type(op_type).__name__}")
        return tuple(op for op in self._flow.ops if op.op_type == op_type)

    def get_matched_ops_for_op_name(self, pattern: str) -> tuple[OpInfo, ...]:
        """Ops whose whole name matches the regular expression (`linear1.linear`, `.*linear.*`)."""
        regex = _pattern(pattern, "op name")
        return tuple(op for op in self._flow.ops if regex.fullmatch(op.op_name))

    def get_matched_ops_for_module_name(self, pattern: str) -> tuple[OpInfo, ...]:
        """Ops run inside a module (at any depth) whose whole path matches the regular expression."""
        regex = _pattern(pattern, "module name")
        return tuple(op for op in self._flow.ops
                     if any(regex.fullmatch(ctx.module_name) for ctx in op.module_stack if ctx.module_name))

    def get_matched_ops_for_module_type(self, pattern: str) -> tuple[OpInfo, ...]:
        """Ops run inside a module whose fully qualified type matches (`torch\\.nn\\.modules\\.linear\\.Linear`)."""
        regex = _pattern(pattern, "module type")
        return tuple(op for op in self._flow.ops if any(regex.fullmatch(ctx.module_type) for ctx in op.module_stack))

    # -- views --------------------------------------------------------------------------------

    def format_summary(self, colorize: bool = True, details: bool = False) -> str:
        """The legend and module tree with every op's connectivity, states and call site.

        `colorize=False` drops the ANSI codes; `details=True` adds each op's variable, shape, FLOPs
        and code, and each module's call count and skip reason.
        """
        return format_summary(self._flow, colorize=colorize, details=details)
