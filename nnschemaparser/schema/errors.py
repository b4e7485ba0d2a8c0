"""The exceptions nnschemaparser raises on its own account, and the package's one exception tree.

Exceptions raised by the user's model code are never wrapped: they keep their type and get a note
naming the instruction and the forward's file:line. Everything below is about our side: every
exception and warning class the package defines, under its base, with the module defining it (in
parentheses; none: this module). The classes stay in their stages' modules, since schema/ imports
nothing of the package; tests/test_error_tree.py fails when one is missing here, gone, or moved.

    Exception
    ├── NNSchemaError                                         base of the errors a caller of the package catches
    │   ├── UnsupportedSyntaxError                            the lowering cannot express a construct (child skipped)
    │   ├── SourceUnavailableError                            no source for a forward (C extension, REPL, stripped)
    │   ├── ParseError                                        parse_model was given inputs it cannot use
    │   ├── StateNotRestoredError (parser.state_guard)        a run changed a model tensor by a route the guard cannot see
    │   ├── SchemaRunError                                    the schema cannot run as given (missing input, ...)
    │   │   ├── StaleSchemaError                              a forward replaced on its class, a decorator's choice changed
    │   │   ├── LogicalCaptureError (distributed.logical)     ranks that disagree, or a value that cannot be gathered
    │   │   ├── CaptureTooLargeError (traces.estimate)        a capture whose memory estimate does not fit, refused
    │   │   ├── InterventionError (traces.interventions)      an intervention that cannot apply or changed nothing
    │   │   └── DivergeError (traces.diverge)                 diverge cannot compare the two configurations as given
    │   ├── KeepWrappedError (traces.wrapped)                 a keep= of a wrapped model's paths, given its wrapper's schema
    │   ├── EditError                                         a stepping edit: unknown variable, other shape/dtype
    │   ├── SchemaFormatError                                 a saved schema or trace file is malformed or unsafe
    │   │   ├── MalformedFileError (files.file_format)        not JSON, a field of the wrong type, truncated, ...
    │   │   │   └── StoreLinkError (store.guard)              a symbolic link inside a store folder, never followed
    │   │   ├── FormatVersionError (files.file_format)        another format, or a version this release cannot read
    │   │   ├── FileLimitError (files.file_format)            past a FileLimits bound (size, nesting, counts)
    │   │   ├── UnsafeReferenceError (files.file_format)      a callable, global or attribute off the allowlist
    │   │   │   └── SourceMismatchError (files.verification)  load_schema(model=...): not the source's instructions
    │   │   └── ModelMismatchError (files.file_format)        load_schema(model=...): another structure
    │   │       ├── SourceMismatchError (files.verification)  the same class, under both of its bases
    │   │       └── StoreMismatchError (store.manifest)       a store written for another schema or options
    │   ├── GraphExportError (inspection.export_flow)         torch.export cannot export the model (graph mode)
    │   ├── TargetError (inspection.target)                   a CLI target that cannot be loaded or built
    │   ├── PlanError (inspection.plan)                       plan options that cannot be used
    │   ├── PlanAPIError (inspection.plan_client)             the plan deployment is unreachable or gives no plan
    │   ├── GPUTableError (inspection.gpu_table)              a GPU table override that cannot be read
    │   ├── GraphFileError (inspection.neurarch_graph)        not a readable .neurarch.json graph file
    │   ├── TensorViewError (widget.tensor_views)             a tensor view the inspector cannot draw
    │   ├── RoutingViewError (widget.routing_view)            the routing view of a schema with no experts block
    │   ├── LogicalViewError (widget.logical_view)            the logical view without a logical trace
    │   ├── PatchViewError (widget.patch_view)                a patching table the Patch view cannot show or open
    │   ├── DivergeViewError (widget.diverge_view)            a report the Diverge view cannot show or step
    │   ├── InspectorError (widget.state)                     a request the inspector cannot carry out
    │   └── CollectiveError (distributed.collective)          a collective stepped run cannot go on on every rank
    │       ├── RankFailedError (distributed.collective)      another rank raised (names it and its exception)
    │       ├── RanksDivergedError (distributed.collective)   the ranks reached different instructions
    │       └── CollectiveTimeoutError (distributed.collective)  no answer from the other ranks in time
    ├── BuildError (widget.build)                             the widget bundle cannot be built (no js/, node, npm)
    ├── _QuotaExhausted (inspection.capture)                  internal: a shared capture quota ran out
    ├── _WalkExhausted (inspection.capture)                   internal: an input or output walk hit its quota
    ├── _Usage (inspection.cli)                               internal: bad usage after argparse (exit status 1)
    ├── _Difference (files.verification)                      internal: a difference, raised as SourceMismatchError
    ├── QuotaError (widget.share_server)                      a share the store's quotas refuse (HTTP 507)
    ├── _Refused (widget.share_server)                        internal: a request the server refuses (HTTP status)
    ├── _Refused (widget.share_worker)                        internal: the same, raised in a worker process
    ├── Refusal (widget.share_queue)                          internal: a request the fair queue answers at once (503, 408, 413)
    ├── _WriteFailed (store.writer)                           internal: a store file could not be written (StoreIncompleteError)
    └── RegionRefused (traces.compile_regions)                internal: the compiler refused a region (its enclosing one stands)
    RuntimeError
    ├── ModelExit (inspection.cli)                            the model's own code called sys.exit (CLI status 1)
    ├── ModelAbort (inspection.cli)                           the model's code raised GeneratorExit or its own BaseException (CLI status 1)
    ├── StoreIncompleteError (store.manifest)                 capture_dataset did not write every input (a rank died or fell silent, a full disk)
    └── StoreBusyError (store.guard)                          another capture_dataset holds the store's lock
    UserWarning
    ├── GraphMismatchWarning (inspection.inspector)           graph mode: the exported result is not eager's
    ├── CaptureLimitWarning (traces.dropped)                  capture_run's CaptureLimits dropped values (trace.dropped)
    ├── KeepMissedWarning (traces.missed)                     a call= selector named a call an unobserved block made
    └── PatchingReuseWarning (traces.patching)                activation_patching reran every patched run from the start
    BaseException
    └── StepAbandoned (runtime.listeners)                      unwinds a paused stepped run; passes `except Exception:`
"""

from __future__ import annotations

__all__ = [
    "NNSchemaError",
    "UnsupportedSyntaxError",
    "SourceUnavailableError",
    "ParseError",
    "SchemaRunError",
    "StaleSchemaError",
    "EditError",
    "SchemaFormatError",
]


class NNSchemaError(Exception):
    """Base class of the errors raised by nnschemaparser itself."""


class UnsupportedSyntaxError(NNSchemaError):
    """A construct the lowering cannot express; carries the file:line of the construct."""

    def __init__(self, message: str, filename: str = "", lineno: int = 0):
        self.filename = filename
        self.lineno = lineno
        where = f"{filename}:{lineno}: " if filename else ""
        super().__init__(f"{where}{message}")


class SourceUnavailableError(NNSchemaError):
    """The source of a function could not be read."""


class ParseError(NNSchemaError):
    """parse_model cannot use the inputs it was given."""


class SchemaRunError(NNSchemaError):
    """The schema cannot run as given."""


class StaleSchemaError(SchemaRunError):
    """What a block was lowered from no longer holds (its forward replaced on its class, a
    dispatching decorator now picking another implementation): the schema would run code eager no
    longer runs. The message names it, where it was lowered from, and the fix (parse the model
    again). Names a forward reads are read live and never raise this (a deleted global is Python's
    NameError, as in eager)."""


class EditError(NNSchemaError):
    """A stepping edit that would be invalid; nothing was changed."""


class SchemaFormatError(NNSchemaError):
    """A saved schema or trace file is malformed or unsafe to load."""
