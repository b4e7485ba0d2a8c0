"""Regions of a schema's generated code, compiled on their own with a `torch.compile` backend.

`diverge_compile` localizes a compiled model's divergence by compiling smaller and smaller pieces
of the schema's own generated code (`runtime.codegen`) with the backend the user compiled the model
with. This module holds the pieces it needs:

- `compiled_backend(model_b)`: the backend object stored in a `torch.compile` wrapper (an
  `OptimizedModule`), reused as given: a user backend (any callable `gm, example_inputs ->
  callable`), `"aot_eager"`, inductor with its mode and options.
- `RegionCompiler`: compiles one function with that backend behind a shim that counts the graphs
  it is handed (a graph break shows as several) and the time the first call took.
- `TraceableProgram`: a plain `Program` whose generated code dynamo traces without a graph break.
- `RecordingProgram`: a plain `Program` that records each block call (block, inputs, output, the
  call it ran inside), so a block can be replayed alone on the inputs it had in the eager run.
- `statement_frames`: a block call replayed one top-level statement at a time (frame-mode parts of
  the generated code), giving the values of every variable before each statement.
- `region_function`: statements `[start, stop)` of a block's forward as one real function in the
  generated code's *locals* form: `fn(self, *live_in) -> tuple(outputs)`. Dynamo traces it as it
  traces a plain forward (a frame dict would make it break the graph at the first `_class_dict`
  read after a write to the dict).

Depends on the schema and the runtime (`program`, `codegen` through it, `instructions`, `listeners`).
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import time
import types
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..runtime.functions import names_read
from ..runtime.instructions import bound_names, walk_instructions
from ..runtime.listeners import RETURN, RETURN_SLOT
from ..runtime.program import CompiledFunction, Program
from ..schema.model import ModelBlockSchema, ReturnInstruction, YieldInstruction

__all__ = ["compiled_backend", "RegionCompiler", "RegionRefused", "TraceableProgram", "RecordingProgram", "BlockCall",
           "statement_frames", "region_function", "region_io", "statement_cuts", "block_statements", "clone_tree",
           "cast_tree", "model_memo", "twin_block", "block_label"]


class RegionRefused(Exception):
    """The compiler (or the region's shape) refused a region: a graph break, a compile error, a
    statement that cannot run apart (a nested `return`, a frame dict)."""


def compiled_backend(model_b: Any) -> tuple[Callable, Optional[bool], str]:
    """(backend, dynamic, name) of the `torch.compile` wrapper `model_b`: the object dynamo stores
    (`model_b.dynamo_ctx.callback`, unwrapped along `_torchdynamo_orig_backend`), which is the
    `_TorchCompileWrapper` around a user backend or a named one, or inductor's wrapper with its
    mode and options. Calling it is calling the user's backend as given."""
    from torch._dynamo.eval_frame import OptimizedModule, innermost_backend

    if not isinstance(model_b, OptimizedModule):
        raise TypeError(f"model_b is a {type(model_b).__name__}, not a torch.compile wrapper (OptimizedModule); "
                        "pass torch.compile(model, backend=...) as model_b")
    callback = getattr(model_b.dynamo_ctx, "callback", None)
    if callback is None or not callable(callback):
        raise TypeError("model_b's torch.compile context holds no backend (it was compiled with torch.compile(..., "
                        "disable=True) or torch._dynamo.run); pass a model compiled with a backend")
    backend = innermost_backend(callback)
    name = getattr(backend, "compiler_name", None) or getattr(backend, "__name__", None) or type(backend).__name__
    if str(name).startswith("<"):  # torch names a user backend object by its repr ("<... object at 0x...>")
        name = type(getattr(backend, "compiler_fn", backend)).__name__
    return backend, getattr(backend, "dynamic", None), str(name)


class RegionCompiler:
    """Compiles functions with one backend, reused as given, and says what it did.

    Each compiled function gets a copy of its code object, so dynamo keeps one cache entry per
    region (a shared code object would reach dynamo's recompile limit and silently run eager)."""

    def __init__(self, backend: Callable, dynamic: Optional[bool]):
        self.backend = backend
        self.dynamic = dynamic
        self.graphs = 0  # graphs handed to the backend, all regions together
        self.compile_s = 0.0  # first calls (tracing, the backend's compile, one run)
        self.regions = 0

    def _shim(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.graphs += 1
        return self.backend(gm, example_inputs)

    def compile(self, fn: Callable, fullgraph: bool) -> Callable[..., tuple[Any, int]]:
        """`run(*args, **kwargs) -> (result, graphs)`: `fn` compiled; `graphs` counts the graphs its
        first call handed the backend (0 on later calls). A failure raises RegionRefused."""
        copy = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        compiled = torch.compile(copy, backend=self._shim, fullgraph=fullgraph, dynamic=self.dynamic)
        first = [True]

        def run(*args: Any, **kwargs: Any) -> tuple[Any, int]:
            before = self.graphs
            start = time.perf_counter()
            try:
                result = compiled(*args, **kwargs)
            except Exception as error:  # the compiler refused: the caller falls back to the enclosing region
                raise RegionRefused(f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                                    ) from error
            if first[0]:
                first[0] = False
                self.compile_s += time.perf_counter() - start
                self.regions += 1
            return result, self.graphs - before

        return run


def block_label(block: ModelBlockSchema) -> str:
    """The block path the rows use: "" for the root, `h.1.attn`, a method block's `h.1.attn._attn`."""
    path = block.path
    return f"{path}.{block.method_name}" if block.method_name and path else (block.method_name or path)


def twin_block(root: ModelBlockSchema, block: ModelBlockSchema) -> ModelBlockSchema:
    """The block of schema `root` at `block`'s path (and method)."""
    twin = root.find(block.path)
    if block.method_name:
        twin = twin.methods[block.method_name]
    return twin


class BlockCall:
    """One call of a block in the recorded eager run: `line` is the line of the caller's code that
    made it (the innermost frame of the caller's file), `end` its place among the calls' ends."""

    __slots__ = ("block", "args", "kwargs", "output", "parent", "index", "occurrence", "end", "line")

    def __init__(self, block: ModelBlockSchema, args: tuple, kwargs: dict, parent: Optional["BlockCall"],
                 index: int, occurrence: int):
        self.block, self.args, self.kwargs, self.output = block, args, kwargs, None
        self.parent, self.index, self.occurrence = parent, index, occurrence
        self.end = -1  # calls ended before this one (its place in the order values are bound)
        self.line = 0


class TraceableProgram(Program):
    """A plain program whose generated code dynamo can trace without a graph break: a method call on
    a tensor is written as a call (a plain program first asks whether the bound method is a module,
    which dynamo cannot answer for an intermediate tensor), a call through a value is a plain call
    while dynamo traces (`torch.compiler.is_compiling()`). Eager runs of it compute what a plain run does."""

    traceable = True


class RecordingProgram(Program):
    """A plain program that records each block call while `recording` is set: the block, copies of
    its inputs and output, the call it ran inside. `replace[id(block)]`, when set, runs instead of
    the block's own invoker (a compiled region), recorded the same way."""

    def __init__(self, root: ModelBlockSchema, memo: Optional[dict] = None):
        super().__init__(root)
        self.memo = memo
        self.recording = False
        self.calls: list[BlockCall] = []
        self.replace: dict[int, Callable[[Any, dict], Any]] = {}
        self._stack: list[BlockCall] = []
        self._wrapped: dict[int, Callable] = {}
        self._counts: dict[int, int] = {}
        self._ended = 0

    def reset(self) -> None:
        self.calls, self._stack, self._counts, self._ended = [], [], {}, 0

    def invoker(self, block: ModelBlockSchema) -> Callable[[Any, dict], Any]:
        wrapped = self._wrapped.get(id(block))
        if wrapped is not None:
            return wrapped
        inner = super().invoker(block)
        key = id(block)

        def wrapped(args: Any, kwargs: dict) -> Any:
            if not self.recording:
                return inner(args, kwargs)
            occurrence = self._counts.get(key, 0)
            self._counts[key] = occurrence + 1
            call = BlockCall(block, clone_tree(tuple(args), self.memo), clone_tree(dict(kwargs), self.memo),
                             self._stack[-1] if self._stack else None, len(self.calls), occurrence)
            if call.parent is not None and call.parent.block.signature is not None:
                call.line = _caller_line(call.parent.block.signature.filename)
            self.calls.append(call)
            self._stack.append(call)
            try:
                run = self.replace.get(key, inner)
                output = run(args, kwargs)
            finally:
                self._stack.pop()
            call.output = clone_tree(output, self.memo)
            call.end = self._ended
            self._ended += 1
            return output

        self._wrapped[key] = wrapped
        return wrapped


def _caller_line(filename: str) -> int:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename == filename:
            return frame.f_lineno or 0
        frame = frame.f_back
    return 0


_ATOMIC = (int, float, bool, complex, str, bytes, type(None), type, torch.dtype, torch.device, torch.Size,
           types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType, nn.Module)


def model_memo(model: Any) -> dict:
    """A `copy.deepcopy` memo that keeps `model`'s modules, parameters and buffers as they are."""
    memo: dict = {}
    if isinstance(model, nn.Module):
        for module in model.modules():
            memo[id(module)] = module
            for tensor in list(module._parameters.values()) + list(module._buffers.values()):
                if tensor is not None:
                    memo[id(tensor)] = tensor
    return memo


def clone_tree(value: Any, memo: Optional[dict] = None) -> Any:
    """`value` with each tensor in it (tuples, lists, dicts, pytree nodes) replaced by a detached copy.

    With `memo` (`model_memo`), other objects are deep-copied too (a transformers cache a block
    appends to), the model's modules and weights kept: a replay must not change what it was given."""
    def clone(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return v.detach().clone()
        if memo is None or isinstance(v, _ATOMIC) or id(v) in memo:
            return v
        try:
            return copy.deepcopy(v, dict(memo))
        except Exception:  # not copyable: shared, as the eager run shares it
            return v

    return pytree.tree_map(clone, value)


def cast_tree(value: Any, dtype: torch.dtype, memo: Optional[dict] = None) -> Any:
    """`value` with each floating tensor in it cast to `dtype` (copies; other tensors and, with
    `memo`, other objects copied as `clone_tree` does)."""
    def cast(v: Any) -> Any:
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v.detach().to(dtype)
        return clone_tree(v, memo)

    return pytree.tree_map(cast, value)


def block_statements(block: ModelBlockSchema) -> tuple[list, Optional[ReturnInstruction]]:
    """The top-level instructions of `block`'s forward that compute something, and its final
    top-level `return` (None when the body does not end with one)."""
    body = list(block.signature.body)
    final = body[-1] if body and isinstance(body[-1], ReturnInstruction) else None
    return (body[:-1] if final is not None else body), final


def statement_frames(program: Program, block: ModelBlockSchema, args: tuple, kwargs: dict,
                     memo: Optional[dict] = None) -> tuple[list, Any]:
    """The call `block(*args, **kwargs)` replayed one top-level statement at a time.

    Returns (frames, output): `frames[k]` holds copies of the variables before statement k
    (`frames[n]`: after the last one), `output` what the block returned. Raises RegionRefused when
    a statement leaves the block early (a `return` inside an `if`) or the body yields."""
    statements, final = block_statements(block)
    unit = program.unit(block)
    frame = unit.bind(tuple(clone_tree(args, memo)), clone_tree(kwargs, memo))
    frames = [_snapshot(frame, unit.self_name, memo)]
    for k, instr in enumerate(statements):
        if any(isinstance(i, (ReturnInstruction, YieldInstruction)) for i in walk_instructions([instr])):
            raise RegionRefused(f"statement {k + 1} (line {_line(instr)}) can leave the block early "
                                "(a return or yield inside it)")
        signal = program.part(unit, [instr])(frame)
        if signal is not None:
            raise RegionRefused(f"statement {k + 1} (line {_line(instr)}) left the block early ({signal})")
        frames.append(_snapshot(frame, unit.self_name, memo))
    if final is None:
        output = None
    else:
        signal = program.part(unit, [final])(frame)
        if signal != RETURN:
            raise RegionRefused("the block's last return did not run")
        output = frame.pop(RETURN_SLOT)
    return frames, output


def _snapshot(frame: dict, self_name: Optional[str], memo: Optional[dict]) -> dict:
    return {name: (value if name == self_name else clone_tree(value, memo)) for name, value in frame.items()
            if name != RETURN_SLOT}


def _line(instr: Any) -> Any:
    return instr.location.lineno if instr.location is not None else "?"


def region_io(block: ModelBlockSchema, start: int, stop: int, before: dict, after: dict) -> tuple[list, list]:
    """(live_in, outputs) of statements `[start, stop)`: the variables they read or may rebind that
    exist before them, and those they bind that exist after them."""
    statements, _ = block_statements(block)
    sig = block.signature
    skip = {sig.self_name} | set(sig.weight_refs)
    reads, writes = [], []
    for instr in walk_instructions(statements[start:stop]):
        reads.extend(names_read(instr))
        writes.extend(bound_names(instr))
    # Temporaries (`$t3`) are outputs only where read later: by the block's final return, or after a
    # cut that is not between statements; a method fetched for a call in the region never is.
    _, final = block_statements(block)
    later = {n for i in walk_instructions(statements[stop:]) for n in names_read(i)}
    later.update(names_read(final) if final is not None else ())
    live_in = [n for n in dict.fromkeys(reads + writes) if n in before and n not in skip]
    outputs = [n for n in dict.fromkeys(writes)
               if n in after and n not in skip and (not n.startswith("$") or n in later)]
    return live_in, outputs


def statement_cuts(block: ModelBlockSchema) -> list[int]:
    """Where the block's top-level instructions may be cut into regions: between source statements,
    that is, where no temporary (`$t3`: an expression's intermediate value, a method fetched before
    its call) bound before the cut is read after it. Includes 0 and the number of instructions."""
    statements, _ = block_statements(block)
    reads_after: list[set] = [set() for _ in range(len(statements) + 1)]
    for k in range(len(statements) - 1, -1, -1):
        names = {n for i in walk_instructions([statements[k]]) for n in names_read(i) if n.startswith("$")}
        reads_after[k] = reads_after[k + 1] | names
    cuts, bound = [0], set()
    for k, instr in enumerate(statements):
        bound.update(n for i in walk_instructions([instr]) for n in bound_names(i) if n.startswith("$"))
        if k + 1 == len(statements) or not (bound & reads_after[k + 1]):
            cuts.append(k + 1)
    return cuts


def region_function(program: Program, block: ModelBlockSchema, start: int, stop: int, live_in: list,
                    outputs: list) -> tuple[Callable, Any]:
    """Statements `[start, stop)` of `block`'s forward as `(fn, self_value)`, where
    `fn(self_value, *live_in)` returns the tuple of `outputs`: the generated code's own text for
    those statements (locals form), compiled with their source positions."""
    statements, _ = block_statements(block)
    instrs = statements[start:stop]
    if not instrs:
        raise RegionRefused("an empty region")
    nested_exit = [i for i in walk_instructions(instrs) if isinstance(i, (ReturnInstruction, YieldInstruction))]
    if nested_exit:
        raise RegionRefused(f"line {_line(nested_exit[0])} can leave the block early (a return or yield)")
    ret = ReturnInstruction(location=instrs[-1].location, out_vars=list(outputs), as_tuple=True)
    sig = block.signature
    schema = dataclasses.replace(sig, params=list(live_in), vararg=None, kwonly=[], kwarg=None, defaults={},
                                 body=list(instrs) + [ret])
    unit = CompiledFunction(program, block, schema, is_block=True)
    if unit.frame:
        raise RegionRefused(f"its statements keep a frame dict ({unit.why_frame})")
    if unit.self_name is None:
        fn = unit.function
        return (lambda _self, *values: fn(*values)), None
    return unit.function, unit.self_value
