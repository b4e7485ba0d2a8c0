"""The schema data model: plain dataclasses describing a parsed module and its lowered forward.

This module is the bottom of the package. It imports nothing from nnschemaparser and never knows how a
schema is produced (lowering, parser), executed (runtime: program, interpreter) or shown (dump, traces, widget).

A parsed model is a tree of `ModelBlockSchema`, one per `nn.Module` instance. A block's `body` is a
list of instructions drawn from a closed set:

    OpInstruction        call a function, method or operator      out = f(args, kwargs)
    BlockInstruction     call a sub-block (or a method schema)     out = CALL child(args)
    ControlInstruction   if / for / while with nested bodies
    TryInstruction       try / except / else / finally
    WithInstruction      with <context> as <name>: body
    FunctionInstruction  def / lambda / comprehension helper: binds a closure
    RaiseInstruction     raise <exc> [from <cause>]
    DeleteInstruction    del name, ...
    YieldInstruction     out = yield <value>  (a generator function: a @contextmanager method)
    ReturnInstruction, ContinueInstruction, BreakInstruction

Operands inside `args` / `kwargs` are `VarRef`s, literals, or lists/tuples/dicts/slices of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

__all__ = [
    "TensorRepr",
    "TensorReprWithValue",
    "TensorContainer",
    "VarRef",
    "BlockRef",
    "SliceOf",
    "Binding",
    "coverage_frame",
    "Const",
    "SourceLocation",
    "Instruction",
    "OpInstruction",
    "BlockInstruction",
    "ControlInstruction",
    "TryInstruction",
    "WithInstruction",
    "FunctionInstruction",
    "RaiseInstruction",
    "DeleteInstruction",
    "YieldInstruction",
    "ReturnInstruction",
    "ContinueInstruction",
    "BreakInstruction",
    "ModelBlockSchema",
    "FunctionSchema",
    "condition_instructions",
    "is_named_test",
    "TEST_STYLE",
]


# --- values -----------------------------------------------------------------------------------


@dataclass
class TensorRepr:
    """A value flowing through the graph, described by shape and dtype.

    A non-tensor value has `shape=()` and `dtype` set to its type name ("bool", "tuple", ...).
    """

    shape: tuple[int, ...]
    dtype: str

    def describe(self) -> str:
        if self.dtype.startswith("torch."):
            return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"
        return self.dtype


@dataclass
class TensorReprWithValue(TensorRepr):
    """A TensorRepr holding a detached snapshot of the value it describes."""

    value: Any = None


@dataclass
class TensorContainer(TensorReprWithValue):
    """A captured tensor with a stable id ("input_0001", "fc1_0002") and its role ("slot_type")."""

    container_id: str = ""
    slot_type: str = "activation"


# --- operands ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class VarRef:
    """The value bound to `name` in the current block scope."""

    name: str

    def __repr__(self) -> str:
        return f"VarRef({self.name!r})"


@dataclass(frozen=True, eq=False)
class Binding:
    """Where the lowering read a name it resolved: a module global (`namespace` is the function's
    globals dict, `key` the name), a closure cell (`namespace` the cell), followed by attributes
    (`attrs`: `F.gelu` is global `F`, then `.gelu`). The runtime reads the name again at each read,
    as CPython does (see `runtime.codegen.CodeGenerator.bound_const`); `value` is what it gave at
    parse time. `missing`: a global neither the module nor the builtins had at parse time (the
    instruction raising NameError reads it at run time, so a global defined since is found).
    Not saved in schema files: a loaded schema reads what its file names."""

    text: str
    kind: str  # "global" or "closure"
    namespace: Any = field(repr=False)
    key: str = ""
    attrs: tuple = ()
    value: Any = field(default=None, repr=False)
    missing: bool = False


@dataclass(frozen=True, eq=False)
class Const:
    """An object resolved at lowering time (a module-level constant, a class, a dtype), passed as is.

    `text` is how the source spelled it ("MAX_LEN", "torch.float32"), used for display; `binding`
    where it was read, when it came from a global or closure name (the runtime follows a rebinding).
    """

    value: Any
    text: str = ""
    binding: Optional[Binding] = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"Const({self.text or self.value!r})"


@dataclass(frozen=True)
class SliceOf:
    """A slice operand `lower:upper:step` whose parts are operands (VarRef, literal or None)."""

    lower: Any = None
    upper: Any = None
    step: Any = None


@dataclass(frozen=True)
class BlockRef:
    """A reference to a sub-block by attribute path ("fc1", "layers.0").

    `index_var` names the scope variable holding the container index or key for dynamic dispatch:
    a call of the loop variable of `for layer in self.layers` refers to `layers` with the loop's
    `index_var` (`$layer_index`), whose value picks the entry (`layers.<index>`); `self.experts[key](x)`
    names `key`. A constant index (`self.layers[0](x)`, `self.layers[-1](x)`, `self.experts["a"](x)`,
    `self[0](x)`) is bound to a temporary first (`$t2 = 0`), which `index_var` names, so every call of
    a container entry has the same form: the container's path, the variable holding the index or key,
    and the instruction's `callee_var` holding the entry. Every loop form over container entries
    names one too: `for i, layer in enumerate(self.layers)` names `i`; a slice, `reversed(...)` or a
    ModuleDict's `.values()` names `$layer_key`, which the loop body computes from the position;
    `for name, expert in self.experts.items()` names `name`; `zip(self.layers, self.norms)` names each
    container's own index (lowering/container_loops.py).
    `method` names a method schema of the referenced module (None: its forward). `path == ""` refers
    to the block itself (a call to one of its own methods).
    """

    path: str
    index_var: Optional[str] = None
    method: Optional[str] = None


@dataclass(frozen=True)
class SourceLocation:
    """Where an instruction comes from: file, 1-based line, and the source text of that line.

    `col` and `end_col` are the 0-based column range in the file of the expression or statement the
    instruction was lowered from, as Python's `ast` gives it, and `end_lineno` its last line (0: not
    known, e.g. a schema saved before columns were kept).
    """

    filename: str
    lineno: int
    code: str = ""
    col: int = 0
    end_lineno: int = 0
    end_col: int = 0

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}"


# --- instructions -----------------------------------------------------------------------------


@dataclass
class Instruction:
    """Fields shared by every instruction."""

    out_var: str = ""
    resolved: Union[TensorRepr, TensorReprWithValue, None] = None
    location: Optional[SourceLocation] = None


@dataclass
class OpInstruction(Instruction):
    """A call to a function, method or operator.

    `target` is the callable resolved at lowering time, or a VarRef when the callee is a value of the
    scope (a bound method fetched by a previous `getattr`, a lambda, a local function).
    `qualified_name` is the importable name ("torch.nn.functional.linear", "operator.add");
    `display_name` is how the source spelled it ("F.linear", "hidden.relu").
    `args_var` / `kwargs_var` name scope variables unpacked as *args / **kwargs, appended after the
    explicit arguments. `star_args` marks positions in `args` that are unpacked in place (f(*a, b)).
    """

    target: Any = None
    qualified_name: str = ""
    display_name: str = ""
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    args_var: Optional[str] = None
    kwargs_var: Optional[str] = None
    star_args: tuple[int, ...] = ()
    mutates: bool = False
    style: str = "call"
    # Where a `target` resolved at lowering time was read (a global, `F.gelu`): see `Binding`.
    binding: Optional[Binding] = field(default=None, repr=False, compare=False)


@dataclass
class BlockInstruction(Instruction):
    """A call to a sub-block (or a method schema when `block_ref.method` is set).

    `splat_args` is True when the callee is a container chain (an `nn.Sequential` child): its single
    argument is passed along the chain, each entry's output the next one's input. `callee_var`
    names the scope variable holding the module when the call dispatches on a value (a loop variable).
    """

    block_ref: BlockRef = field(default_factory=lambda: BlockRef(""))
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    splat_args: bool = False
    callee_var: Optional[str] = None
    args_var: Optional[str] = None
    kwargs_var: Optional[str] = None
    star_args: tuple[int, ...] = ()


@dataclass
class ControlInstruction(Instruction):
    """An if/elif/else, for or while as a compound node.

    `condition` is the OpInstruction evaluating the test of an "if"/"while" (re-evaluated before
    each iteration of a "while"), or the iterable of a "for"; its `out_var` is `cond_var`, the scope
    variable tested for truth or iterated. `prepare` holds the instructions that run before it, in
    order, to compute its operands (`x.sum()` of `if x.sum() > 0:`). When no op of its own computes
    the value last (a plain name `if flag:`, a comprehension's `.0`, a short-circuit `and`/`or`,
    whose last instruction is an "if" itself, a call of a sub-block, or a loop over a slice of a
    container, which computes the entries' keys after the iterable), every instruction is in
    `prepare` and `condition` is a *named test*: `cond_var = assign(cond_var)` of `style` "test"
    (TEST_STYLE), which names the value and never runs. `condition_instructions(instr)` lists what a
    run executes: `prepare`, then `condition` unless it is a named test.

    For "for", `bind_var` receives each item (a tuple target is unpacked by instructions at the top
    of `body`); `iter_container` names the module container whose entries the loop visits, the
    container itself (`self.layers`) or a view of it (`enumerate(self.layers)`, `self.layers[1:]`,
    `reversed(...)`, `self.experts.items()`), `""` for `self`; `index_var` receives the position of
    each item (0, 1, 2, ...): `$<name>_index`, or the user's own `i` of `for i, layer in
    enumerate(...)` (start 0, never rebound in the body). A `zip` over containers has an `index_var`
    and no single `iter_container` (None). Both are None for other iterables.

    Building one without a `condition` (or with one whose `out_var` is not `cond_var`) raises
    TypeError: the lowering and the file decoder always give one (lowering.ops.split_condition).
    """

    kind: str = "if"
    prepare: list[Instruction] = field(default_factory=list)
    condition: Optional[OpInstruction] = None
    cond_var: str = ""
    body: list[Instruction] = field(default_factory=list)
    else_body: list[Instruction] = field(default_factory=list)
    bind_var: Optional[str] = None
    iter_container: Optional[str] = None
    index_var: Optional[str] = None

    def __post_init__(self) -> None:
        if not isinstance(self.condition, OpInstruction) or self.condition.out_var != self.cond_var:
            raise TypeError(f"a ControlInstruction's condition is an OpInstruction binding cond_var "
                            f"{self.cond_var!r}, got {type(self.condition).__name__}"
                            + (f" binding {self.condition.out_var!r}" if isinstance(self.condition, OpInstruction)
                               else ""))


TEST_STYLE = "test"
"""The `style` of a named test: a condition that names `cond_var` (already computed) and never runs."""


def is_named_test(condition: OpInstruction) -> bool:
    """Whether `condition` only names its value (`style == TEST_STYLE`): it is shown, never run."""
    return condition.style == TEST_STYLE


def condition_instructions(instr: ControlInstruction) -> list[Instruction]:
    """The instructions a run executes, in order, to compute `instr.cond_var` (the test of an
    `if`/`while`, the iterable of a `for`): `instr.prepare`, then `instr.condition` unless it is a
    named test. The runtime reads a condition only through this."""
    if is_named_test(instr.condition):
        return instr.prepare
    return [*instr.prepare, instr.condition]


@dataclass
class TryInstruction(Instruction):
    """try / except Type as name / else / finally.

    `handlers[i]` is the tuple of exception classes of clause i (empty tuple: bare except),
    `handler_names[i]` the bound name or None, `handler_bodies[i]` its instructions.
    """

    body: list[Instruction] = field(default_factory=list)
    handlers: list[tuple[type, ...]] = field(default_factory=list)
    handler_names: list[Optional[str]] = field(default_factory=list)
    handler_bodies: list[list[Instruction]] = field(default_factory=list)
    else_body: list[Instruction] = field(default_factory=list)
    final_body: list[Instruction] = field(default_factory=list)


@dataclass
class WithInstruction(Instruction):
    """with <context_var> [as bind_var]: body — the context manager was computed into `context_var`."""

    context_var: str = ""
    bind_var: Optional[str] = None
    body: list[Instruction] = field(default_factory=list)


@dataclass
class FunctionInstruction(Instruction):
    """Binds `out_var` to a closure over the current scope running `function` (def, lambda, comprehension)."""

    function: Optional["FunctionSchema"] = None
    defaults: list[Any] = field(default_factory=list)
    kw_defaults: dict[str, Any] = field(default_factory=dict)


@dataclass
class RaiseInstruction(Instruction):
    """raise <exc> [from <cause>]; `exc is None` re-raises the exception being handled."""

    exc: Any = None
    cause: Any = None
    has_cause: bool = False


@dataclass
class DeleteInstruction(Instruction):
    """del name, ... — unbinds scope variables."""

    names: list[str] = field(default_factory=list)


@dataclass
class YieldInstruction(Instruction):
    """`out_var = yield value`: suspends a generator function (a `@contextmanager` method) with
    `value`; `out_var` (if any) is bound to what the generator's user sends back."""

    value: Any = None


@dataclass
class ReturnInstruction(Instruction):
    """Returns `out_vars`: one value directly, several as a tuple, none as None."""

    out_vars: list[str] = field(default_factory=list)
    as_tuple: bool = False


@dataclass
class ContinueInstruction(Instruction):
    """continue: skip to the next loop iteration (finally bodies still run)."""


@dataclass
class BreakInstruction(Instruction):
    """break: leave the innermost loop (finally bodies still run)."""


# --- blocks -----------------------------------------------------------------------------------


@dataclass
class FunctionSchema:
    """The signature and lowered body of a function: a forward, a method, a closure or lambda.

    `params` lists positional-or-keyword parameter names (without `self` for methods),
    `vararg` / `kwarg` the *args / **kwargs names, `kwonly` the keyword-only names.
    `filename` and `firstlineno` locate `source` in its file: line `firstlineno + i` of the file is line
    `i` of `source` (for a decorated function `firstlineno` is its first decorator's line, as Python's
    `co_firstlineno`). Nested functions and comprehensions have no `source` of their own; their
    `firstlineno` is their own first line in the same file.
    `free_vars` are the names this function (or a function nested in it) reads or rebinds from
    enclosing scopes, its closure variables; `nonlocal_vars` are those of them it rebinds (a
    `nonlocal` declaration, a walrus in a comprehension), so the enclosing scope sees the new value.
    `weight_refs` maps each variable that reads a parameter or buffer of the module (`self.weight`)
    to that attribute; `self_name` is the name of a method's first parameter (a classmethod
    forward's `cls`).
    """

    name: str = ""
    params: list[str] = field(default_factory=list)
    vararg: Optional[str] = None
    kwonly: list[str] = field(default_factory=list)
    kwarg: Optional[str] = None
    defaults: dict[str, Any] = field(default_factory=dict)
    body: list[Instruction] = field(default_factory=list)
    filename: str = ""
    firstlineno: int = 0
    source: str = ""
    free_vars: tuple[str, ...] = ()
    nonlocal_vars: tuple[str, ...] = ()
    weight_refs: dict[str, str] = field(default_factory=dict)
    self_name: Optional[str] = None


COVERAGE_COLUMNS = ("module", "module_type", "kind", "callee", "via", "block", "location", "calls", "reason", "phase")


def coverage_frame(rows: list, helpers: bool = False):
    """The coverage DataFrame of `rows` (dicts with COVERAGE_COLUMNS); helper rows only if asked."""
    import pandas as pd

    kept = [{"phase": "forward", **row} for row in rows if helpers or row.get("kind") != "helper"]
    return pd.DataFrame(kept, columns=list(COVERAGE_COLUMNS))


@dataclass(eq=False)
class ModelBlockSchema:
    """One block of the tree: a module's forward (or one of its methods) lowered to instructions.

    `name` is the module's class name, `path` its attribute path from the root ("" for the root),
    `module_type` its fully qualified class. `signature` carries the parameter layout used to bind
    calls; `skipped` lists the children that are re-dispatched to their real module, with reasons.
    """

    name: str = ""
    path: str = ""
    module_type: str = ""
    inputs: dict[str, TensorRepr] = field(default_factory=dict)
    outputs: list[TensorRepr] = field(default_factory=list)
    weights: dict[str, TensorReprWithValue] = field(default_factory=dict)
    sub_blocks: dict[str, "ModelBlockSchema"] = field(default_factory=dict)
    body: list[Instruction] = field(default_factory=list)
    module: Any = None
    methods: dict[str, "ModelBlockSchema"] = field(default_factory=dict)
    method_name: Optional[str] = None
    input_defaults: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    signature: Optional[FunctionSchema] = None
    skip_reason: Optional[str] = None
    wrapper: Any = None
    function: Any = None
    # Set by the parser on a block whose forward live code reached on the example run (a library
    # helper or a processor object calling the module): runs lend the module the schema as its
    # instance `forward` for the run, so such calls are interpreted too.
    reached_live: bool = False
    # (class, attribute, function as found in the class dict) this block was lowered from; the
    # runtime refuses to run it once the class holds another (the forward replaced after parsing).
    parsed_from: Any = None
    # For a forward replaced on the instance by a function bound to it (TransformerLens's T5 blocks):
    # the bound method lowered as this block. Runs call the schema while the instance holds it, the
    # real module once it holds another.
    instance_forward: Any = None
    # For a forward a decorator dispatches (`use_experts_implementation`): how the implementation
    # lowered as this block was chosen (`parser.dispatch.Dispatch`); the runtime checks it holds.
    dispatch: Any = None
    # For the method schema of a plain object's `__call__` (`self.processor(...)`): the module
    # attribute holding the object, which is the method's `self` at each call.
    self_attr: Optional[str] = None
    # For the body of a cached function the code calls by a global or closure name (`_freqs(n)`
    # under `functools.cache`): the Binding the name is read through. A call runs this block (on a
    # miss of the real cache) while the name holds `function`, else the value it holds now.
    read_from: Any = None
    # The root's report of what ran outside the schema on the example run (rows of `coverage()`).
    live_calls: list = field(default_factory=list)

    def coverage(self, helpers: bool = False):
        """A DataFrame of what ran outside the schema on the parse-time run, one row per region:
        `module` (its path; None when not a sub-module: a module held in a dict, a global, built
        per call, the reason says which), `module_type`, `kind` ("module": a module's own forward
        ran live), `callee`, `via` (the library function that made the call), `block` and
        `location` (where the schema made the call that led there: block path and file:line),
        `calls` (how many times; 0 for a skipped block the run did not call), `reason` and `phase`
        ("forward", or "backward": what one watched backward pass ran as real modules, a
        checkpoint's recomputation or an adjoint solve; the parse runs it only where the forward's
        coverage has a row, helpers included, and says in a row of kind "unwatched" when it could
        not). Every region `skipped` lists is here. Empty when everything the model computed was
        interpreted. `helpers=True` adds rows of kind "helper": library functions the schema runs
        as one call (like any op) whose module calls were interpreted.

        For a later run, `capture_run(..., coverage=True).coverage()` says the same of that run and
        of a backward pass through its outputs."""
        return coverage_frame(self.live_calls, helpers)

    @property
    def is_skipped(self) -> bool:
        """True when this block is re-dispatched to its real module instead of being interpreted."""
        return self.skip_reason is not None

    def find(self, path: str) -> "ModelBlockSchema":
        """The block at attribute `path` below this one ("encoder.layer.0"), searching nested blocks."""
        if path == "":
            return self
        if path in self.sub_blocks:
            return self.sub_blocks[path]
        parts = path.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            head = ".".join(parts[:cut])
            if head in self.sub_blocks:
                return self.sub_blocks[head].find(".".join(parts[cut:]))
        raise KeyError(f"no sub-block at path {path!r} in block {self.path or self.name!r}; "
                       f"known: {', '.join(sorted(self.sub_blocks)) or '(none)'}")

    def iter_blocks(self):
        """This block, its method blocks and every sub-block below it, depth first."""
        yield self
        yield from self.methods.values()  # method blocks share this block's sub_blocks
        for child in self.sub_blocks.values():
            yield from child.iter_blocks()
