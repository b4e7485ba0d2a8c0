"""Where a `torch.compile`d model parts from eager: down to the source statement, inside compiled code.

`compiled_local_errors(schema, model_a, model_b, inputs)` takes the schema of the eager model
`model_a` and `model_b = torch.compile(model_a_or_copy, backend=...)`. Inside a compiled model no
intermediate value can be seen, so it compiles smaller regions of the *schema's own generated
code* (`runtime.codegen`: one Python function per block body) with model_b's backend, reused as
given (`compile_regions.compiled_backend`), and feeds each region the inputs it had in the eager run:

1. **Blocks.** The root block's generated function is compiled whole (`torch.compile(fn,
   backend=b_backend)`) and run on the model inputs. When its output is out of bounds, the blocks
   it calls are compiled one by one, in the order they ran, each on its eager inputs; the first one
   out of bounds is descended into the same way.
2. **Statements.** In the deepest block out of bounds none of whose children is, the top-level
   statements are bisected: statement ranges compiled as one function each (`fullgraph=True`), on
   the eager values of the variables they read, down to one statement where the compiler allows.

The *local error* of a region is the error of its compiled output against eager's output, fed the
eager inputs; its *bound* is `compile_bound` (a float64 replay of the same region gives eager's own
rounding error; reassociation and fusion stay inside it, an op computed differently does not). The
*carried error* is the error of the same value when the regions tested are chained: every call of
a tested block compiled whole, the localized block run as its compiled statement ranges one after
another, each fed what the one before it computed; the model output's is model_b's own output
against eager's.

When the compiler refuses a region (a graph break under `fullgraph=True`, an error) or a region
cannot run apart (a `return` nested in an `if`, a body that keeps a frame dict), the row says so and
the enclosing region stands. The regions are this package's generated code, not the model's forward
as dynamo would trace it: they run the same ops in the same order, so a backend's graph pass sees
the same ops, though a graph cut at a block boundary may fuse differently than the whole model does.

Limits: a compound statement (`for`, `if`, `with`, `try`) is one statement, its body is not cut; a
block whose forward keeps a frame dict (it defines closures) or leaves early from inside an `if` is
not cut at all. Memory is not bounded: the recorded run keeps a copy of every block call's inputs
and output, the localized block a copy of its variables before each statement, and the float64
twin is a copy of the model at twice its size (meant for the model sizes one debugs a compiler on).

Private to `diverge` (issue 39), which calls it when model_b is a compiled wrapper; not exported.

Depends on the schema, the runtime (`program`), the parser (the float64 twin) and `compile_regions`,
`compile_bound`.
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any, Mapping, Optional

import torch
import torch._dynamo
from torch import nn
from torch.utils import _pytree as pytree

from ..parser.model_parser import NNParser
from ..schema.model import BlockInstruction, ModelBlockSchema
from .compile_bound import Measure, measure
from .compile_regions import (BlockCall, RecordingProgram, RegionCompiler, RegionRefused, block_label,
                              block_statements, cast_tree, clone_tree, compiled_backend, model_memo, region_function,
                              region_io, statement_cuts, statement_frames, twin_block, TraceableProgram)
from ..runtime.instructions import bound_names, walk_instructions

__all__ = ["compiled_local_errors"]

ROW_KEYS = ("block_path", "file", "line", "source", "out_var", "occurrence", "local_error", "carried_error",
            "bound", "flagged", "region")


def compiled_local_errors(schema: ModelBlockSchema, model_a: nn.Module, model_b: Any, inputs: Mapping[str, Any],
                          *, timings: Optional[dict] = None) -> list[dict]:
    """Rows locating where `model_b` (a `torch.compile` wrapper) parts from the eager `model_a`.

    `schema` is the package's parse of `model_a`; `model_b._orig_mod` must be `model_a` or a copy with
    the same weights and dtypes (this compares the compiler alone); `inputs` maps the forward's input
    names to values, passed as `model(**inputs)`. Regions of the schema's generated code are
    compiled with model_b's own backend object (a user backend is called as given), blocks first,
    then statement ranges inside the first block out of bounds (see the module docstring).

    Each row is a dict: `block_path` (the block whose code holds the statement, "" for the root),
    `file`, `line`, `source`, `out_var`, `occurrence` (the n-th run, from 0, of that statement),
    `local_error` (max |compiled - eager| of the statement's value when its region runs compiled on
    eager inputs), `carried_error` (the same value when the tested regions run compiled one after
    another; for the model output, model_b's own output), `bound` (`OWN_FACTOR * own + ULP_FACTOR *
    eps(dtype) * scale`, own = eager's error against a float64 replay of the region, scale = the
    replay's max magnitude), `flagged` (local_error > bound), `region` (the smallest region compiled
    for the row: "block h.1", "statements 3-5 (lines 40-44) of h.1.attn", "statement", with why a
    smaller one was refused). Rows are in the order their values are bound in a run, so the first
    flagged row is the innermost culprit. `timings`, when given a dict, gets `compile_s` (first
    calls of compiled regions), `regions`, `graphs`, `model_b_s` (model_b's own run, with its compile
    the first time), `run_s` (everything else) and `total_s`.
    """
    _check(schema, model_a, model_b, inputs)
    backend, dynamic, _ = compiled_backend(model_b)
    start = time.perf_counter()
    compiler = RegionCompiler(backend, dynamic)
    # The program's invokers are shared code: after a graph break dynamo compiles them as frames of
    # their own, one cache entry per block, and past its recompile limit would run them eagerly, unsaid.
    config = torch._dynamo.config
    limit = max(256, config.recompile_limit)
    with torch.no_grad(), config.patch(recompile_limit=limit,
                                       accumulated_recompile_limit=max(4 * limit, config.accumulated_recompile_limit)):
        localizer = _Localizer(schema, model_a, model_b, dict(inputs), compiler)
        rows = localizer.rows()
    if timings is not None:
        total = time.perf_counter() - start
        timings.update(compile_s=compiler.compile_s, regions=compiler.regions, graphs=compiler.graphs,
                       model_b_s=localizer.model_b_s, run_s=total - compiler.compile_s - localizer.model_b_s,
                       total_s=total)
    return rows


def _check(schema: Any, model_a: Any, model_b: Any, inputs: Any) -> None:
    if not isinstance(schema, ModelBlockSchema):
        raise TypeError(f"schema is a {type(schema).__name__}; pass NNParser.parse_model(model_a, ...)")
    if not isinstance(model_a, nn.Module):
        raise TypeError(f"model_a is a {type(model_a).__name__}, not an nn.Module")
    if schema.module is not model_a:
        raise ValueError("schema is not a parse of model_a (its root module is another object); parse model_a "
                         "itself: NNParser.parse_model(model=model_a, inputs_tensors_values=inputs)")
    if not isinstance(inputs, Mapping) or not all(isinstance(k, str) for k in inputs):
        raise TypeError("inputs must be a dict of input name to value, as model(**inputs) takes them")
    orig = getattr(model_b, "_orig_mod", None)
    if orig is None or orig is model_a:
        return
    state_a, state_b = model_a.state_dict(), orig.state_dict()
    if type(orig) is not type(model_a) or state_a.keys() != state_b.keys():
        raise ValueError(f"model_b compiles a {type(orig).__name__} with other weights than model_a "
                         f"({type(model_a).__name__}); compiled_local_errors compares the compiler alone: compile "
                         "model_a or a copy of it (nnschemaparser.diverge compares other differences)")
    for name, value in state_a.items():
        other = state_b[name]
        if value.dtype != other.dtype or value.device != other.device or not torch.equal(value, other):
            raise ValueError(f"model_b's weight {name!r} differs from model_a's ({other.dtype} on {other.device} "
                             f"against {value.dtype} on {value.device}, or other values); compiled_local_errors "
                             "compares the compiler alone: compile model_a or a copy with the same weights")


class _Tested:
    """A region compiled and measured: per output variable, its Measure (or why it was refused)."""

    def __init__(self, label: str, measures: dict, refused: Optional[str] = None, graphs: int = 1):
        self.label = label
        self.measures = measures
        self.refused = refused
        self.graphs = graphs
        self.note: Optional[str] = None
        # what the chained run needs to run the region again (statement ranges only)
        self.run: Any = None
        self.self_value: Any = None
        self.live_in: list = []
        self.outputs: list = []

    @property
    def flagged(self) -> bool:
        return self.refused is None and any(m is not None and m.flagged for m in self.measures.values())


class _Localizer:
    def __init__(self, schema: ModelBlockSchema, model_a: nn.Module, model_b: Any, inputs: dict,
                 compiler: RegionCompiler):
        self.schema, self.model_a, self.model_b, self.inputs = schema, model_a, model_b, inputs
        self.compiler = compiler
        self.memo = model_memo(model_a)
        self.eager = RecordingProgram(schema, self.memo)
        self.clean = TraceableProgram(schema)
        self.eager.recording = True
        self.output = self.eager.call_root((), clone_tree(inputs, self.memo))
        self.eager.recording = False
        self.calls = self.eager.calls
        # one plain run first: a program's first call of a child compiles it and rewrites the caller's
        # globals (`lazy_invoker`), which dynamo would see as a side effect and break the graph at
        again = self.clean.call_root((), clone_tree(inputs, self.memo))
        if not _same(again, self.output):
            raise ValueError("model_a gives other values on a second run with the same inputs (dropout in training "
                             "mode, an unseeded random op, state the forward changes): regions can only be compared "
                             "on repeatable runs; call model_a.eval() and model_b.eval(), or seed the random ops")
        self.twin, self.twin_program = self._float64_twin()
        self.block_runs: dict[int, Any] = {}
        self.model_b_s = 0.0  # model_b's own run (its compile, the first time)
        self.tested: dict[int, _Tested] = {}  # by call index
        self.children_note: dict[int, str] = {}

    def _float64_twin(self) -> tuple:
        """A float64 copy of model_a and its schema, whose regions give the bounds (None, None when
        the copy cannot be parsed or run: the bounds keep their eps term only)."""
        inputs64 = cast_tree(self.inputs, torch.float64, self.memo)
        try:
            twin_model = copy.deepcopy(self.model_a).to(torch.float64)
            twin = NNParser.parse_model(model=twin_model, inputs_tensors_values=inputs64)
            program = TraceableProgram(twin)
            program.call_root((), cast_tree(self.inputs, torch.float64, self.memo))
        except Exception:  # a model that has no float64 form (an op without a float64 kernel)
            return None, None
        self.twin_model = twin_model  # the schema holds its modules weakly
        return twin, program

    # -- blocks --------------------------------------------------------------------------------

    def block_runner(self, block: ModelBlockSchema):
        run = self.block_runs.get(id(block))
        if run is None:
            invoke = self.clean.invoker(block)

            def block_region(*args: Any, **kwargs: Any) -> Any:
                return invoke(args, kwargs)

            run = self.block_runs[id(block)] = self.compiler.compile(block_region, fullgraph=False)
        return run

    def test_block(self, call: BlockCall) -> _Tested:
        label = block_label(call.block)
        try:
            args, kwargs = clone_tree(call.args, self.memo), clone_tree(call.kwargs, self.memo)
            result, graphs = self.block_runner(call.block)(*args, **kwargs)
        except RegionRefused as refusal:
            tested = _Tested(label, {}, refused=str(refusal))
        else:
            exact = self._twin_block_output(call)
            tested = _Tested(label, {"": measure(result, call.output, exact)}, graphs=graphs)
        self.tested[call.index] = tested
        return tested

    def _twin_block_output(self, call: BlockCall) -> Any:
        if self.twin is None:
            return None
        try:
            block64 = twin_block(self.twin, call.block)
            args = cast_tree(call.args, torch.float64, self.memo)
            kwargs = cast_tree(call.kwargs, torch.float64, self.memo)
            return self.twin_program.call_block(block64, tuple(args), dict(kwargs))
        except Exception:  # no float64 replay (an op without float64): the bound keeps its eps term only
            return None

    def descend(self) -> BlockCall:
        """The deepest block call out of bounds none of whose children (compiled alone) is."""
        node = self.calls[0]
        while True:
            flagged = None
            refused = []
            for child in (c for c in self.calls if c.parent is node):
                tested = self.test_block(child)
                if tested.refused is not None:
                    refused.append(f"block {tested.label} refused by the compiler: {tested.refused}")
                elif tested.flagged:
                    flagged = child
                    break
            if refused:
                self.children_note[node.index] = "; ".join(refused)
            if flagged is None:
                return node
            node = flagged

    # -- statements ----------------------------------------------------------------------------

    def test_range(self, call: BlockCall, frames: list, lo: int, hi: int, label: str) -> _Tested:
        """Instructions `[lo, hi)` of the call's block compiled as one function (`fullgraph=True`) and
        run on the eager values they read."""
        block = call.block
        try:
            live_in, outputs = region_io(block, lo, hi, frames[lo], frames[hi])
            fn, self_value = region_function(self.clean, block, lo, hi, live_in, outputs)
            # a first call rewrites the generated code's globals (`lazy_invoker`): not under dynamo
            fn(self_value, *[clone_tree(frames[lo][n], self.memo) for n in live_in])
            run = self.compiler.compile(fn, fullgraph=True)
            result, graphs = run(self_value, *[clone_tree(frames[lo][n], self.memo) for n in live_in])
        except RegionRefused as refusal:
            return _Tested(label, {}, refused=str(refusal))
        exact = self._twin_range(block, lo, hi, live_in, outputs, frames[lo])
        measures = {}
        for k, name in enumerate(outputs):
            measures[name] = measure(result[k], frames[hi][name], exact[k] if exact is not None else None)
        tested = _Tested(label, measures, graphs=graphs)
        tested.run, tested.self_value, tested.live_in, tested.outputs = run, self_value, live_in, outputs
        return tested

    def _twin_range(self, block: ModelBlockSchema, lo: int, hi: int, live_in: list, outputs: list,
                    frame: dict) -> Optional[tuple]:
        if self.twin is None:
            return None
        try:
            fn, self_value = region_function(self.twin_program, twin_block(self.twin, block), lo, hi, live_in, outputs)
            return fn(self_value, *[cast_tree(frame[n], torch.float64, self.memo) for n in live_in])
        except Exception:  # no float64 replay: the bound keeps its eps term only
            return None

    def bisect(self, call: BlockCall, frames: list, cuts: list) -> list:
        """Segments (lo, hi, tested) covering the block's instructions, cut between source statements
        (`cuts`); the flagged one as small as the compiler allows."""
        def test(a: int, b: int) -> _Tested:
            return self.test_range(call, frames, cuts[a], cuts[b], _range_label(call.block, cuts, a, b))

        a, b = 0, len(cuts) - 1
        current = test(a, b)
        if not current.flagged:
            if current.refused is None:
                current.note = "not split: the statements compiled as one range stay in bounds"
            return [(cuts[a], cuts[b], current)]
        segments: list = []
        while b - a > 1:
            m = (a + b) // 2
            left = test(a, m)
            if left.flagged:
                segments.append((cuts[m], cuts[b], test(m, b)))
                b, current = m, left
                continue
            right = test(m, b)
            if right.flagged:
                segments.append((cuts[a], cuts[m], left))
                a, current = m, right
                continue
            refused = [t.refused for t in (left, right) if t.refused]
            current.note = ("smaller ranges refused: " + "; ".join(refused)) if refused else \
                "each half alone stays in bounds"
            break
        segments.append((cuts[a], cuts[b], current))
        return sorted(segments, key=lambda segment: segment[0])

    # -- the chained run (carried errors) --------------------------------------------------------

    def chain(self, call: BlockCall, segments: list, frames: list) -> Optional[list]:
        """The localized call run as its segments, each compiled, each fed the previous one's output:
        the frames after each segment (None when a segment cannot run)."""
        unit = self.clean.unit(call.block)
        frame = unit.bind(tuple(clone_tree(call.args, self.memo)), clone_tree(call.kwargs, self.memo))
        after: list = [None] * len(frames)
        for lo, hi, tested in segments:
            run = tested.run
            if run is None:
                try:
                    live_in, outputs = region_io(call.block, lo, hi, frames[lo], frames[hi])
                    fn, self_value = region_function(self.clean, call.block, lo, hi, live_in, outputs)
                except RegionRefused:
                    return None
                result = fn(self_value, *[frame[n] for n in live_in])
            else:
                live_in, outputs = tested.live_in, tested.outputs
                try:
                    result, _ = run(tested.self_value, *[frame[n] for n in live_in])
                except RegionRefused:
                    return None
            frame.update(zip(outputs, result))
            after[hi] = dict(frame)
        return after

    def hybrid_outputs(self, localized: BlockCall, chain_output: Any) -> dict:
        """Outputs of the tested calls in a run where the deepest tested blocks run compiled whole and
        the localized block runs as its chain; keyed by (block id, occurrence)."""
        def inside_localized(call: BlockCall) -> bool:
            parent = call.parent
            while parent is not None and parent is not localized:
                parent = parent.parent
            return parent is localized

        # without a chain, the localized block runs compiled whole: what it calls is not seen
        tested_calls = [c for c in self.calls if c.index in self.tested
                        and not (chain_output is None and inside_localized(c))]
        ancestors = set()
        for c in tested_calls:
            p = c.parent
            while p is not None:
                ancestors.add(id(p.block))
                p = p.parent
        hybrid = RecordingProgram(self.schema, self.memo)
        for c in tested_calls:
            if id(c.block) in ancestors or self.tested[c.index].refused is not None:
                continue
            runner = self.block_runner(c.block)
            hybrid.replace[id(c.block)] = lambda args, kwargs, runner=runner: runner(*args, **kwargs)[0]
        if chain_output is not None:
            hybrid.replace[id(localized.block)] = chain_output
        hybrid.recording = True
        try:
            hybrid.call_root((), clone_tree(self.inputs, self.memo))
        except Exception:  # a region that ran alone fails chained: no carried errors for the blocks
            return {}
        return {(id(c.block), c.occurrence): c.output for c in hybrid.calls}

    # -- rows ----------------------------------------------------------------------------------

    def rows(self) -> list[dict]:
        root = self.calls[0]
        whole = self.test_block(root)
        # a root the compiler refuses whole may still be entered: its blocks may compile alone
        localized = self.descend() if whole.flagged or whole.refused else None
        statement_rows: list = []
        chain_runner = None
        if localized is not None and localized.block.skip_reason is None and localized.block.signature is not None:
            statement_rows, chain_runner = self.localize(localized)
        carried = self.hybrid_outputs(localized, chain_runner) if localized is not None else {}
        rows: list = []
        covered = {id(r.pop("_instr")) for r in statement_rows if "_instr" in r}
        for c in self.calls:
            tested = self.tested.get(c.index)
            if tested is None:
                continue
            instr = _call_instruction(c)
            if c.parent is not None and c.parent is localized and instr is not None and id(instr) in covered:
                continue
            rows.append(self.block_row(c, tested, instr, carried))
        rows.extend(statement_rows)
        rows.sort(key=lambda r: r.pop("_order"))
        return rows

    def block_row(self, call: BlockCall, tested: _Tested, instr: Any, carried: dict) -> dict:
        m = tested.measures.get("")
        region = f"block {block_label(call.block) or call.block.name}"
        if tested.refused:
            region += f" (refused by the compiler: {tested.refused}; see the enclosing block)"
        elif tested.graphs > 1:
            region += f" (compiled as {tested.graphs} graphs)"
        note = self.children_note.get(call.index)
        if note:
            region += f" ({note})"
        if call.parent is None:
            _, final = block_statements(call.block) if call.block.signature is not None else ([], None)
            instr = final
            start = time.perf_counter()
            real = self.model_b(**clone_tree(self.inputs, self.memo))
            self.model_b_s = time.perf_counter() - start
            carried_error = _error(measure(real, self.output, None))
            path, out_var = "", ",".join(final.out_vars) if final is not None else "return"
            occurrence = 0
        else:
            carried_error = _error(measure(carried[(id(call.block), call.occurrence)], call.output, None)) \
                if (id(call.block), call.occurrence) in carried else math.nan
            path = block_label(call.parent.block)
            out_var = instr.out_var if instr is not None else ""
            occurrence = sum(1 for c in self.calls[:call.index] if c.parent is not None
                             and c.parent.block is call.parent.block and _call_instruction(c) is instr)
        return _row(path, instr, out_var, occurrence, m, carried_error, region, call.end)

    def localize(self, call: BlockCall) -> tuple[list, Any]:
        block = call.block
        label = block_label(block) or block.name
        try:
            frames, output = statement_frames(self.clean, block, call.args, call.kwargs, self.memo)
            if not _same(output, call.output):
                raise RegionRefused("its statements replayed one at a time give another output than the block")
        except RegionRefused as refusal:
            note = self.children_note.get(call.index)
            self.children_note[call.index] = (f"{note}; " if note else "") + f"statements not compiled apart: {refusal}"
            return [], None
        cuts = statement_cuts(block)
        if len(cuts) < 2:  # an empty body
            return [], None
        segments = self.bisect(call, frames, cuts)
        if len(segments) == 1 and segments[0][2].refused:
            note = self.children_note.get(call.index)
            self.children_note[call.index] = (f"{note}; " if note else "") + \
                f"its statements compiled apart refused by the compiler: {segments[0][2].refused}"
        statements, final = block_statements(block)
        children = {id(_call_instruction(c)): self.tested[c.index] for c in self.calls
                    if c.parent is call and c.index in self.tested}
        # carried values only where some segment ran compiled (a chain of eager code carries nothing)
        after = self.chain(call, segments, frames) if any(t.run is not None for _, _, t in segments) else None
        rows = []
        groups = list(zip(cuts[:-1], cuts[1:]))
        for lo, hi, tested in segments:
            multi = sum(1 for g in groups if lo <= g[0] < hi) > 1
            for g_lo, g_hi in (g for g in groups if lo <= g[0] < hi):
                for var, instr in _statement_vars(statements, g_lo, g_hi, tested.outputs):
                    last = all(var not in bound_names(i) for i in walk_instructions(statements[g_hi:hi]))
                    m = tested.measures.get(var) if last else None
                    region = _segment_region(tested)
                    child = children.get(id(instr))
                    if child is not None and multi and child.refused is None:
                        m, region = child.measures.get(""), f"block {child.label}"
                    carried_error = math.nan
                    if after is not None and after[hi] is not None and last and var in after[hi]:
                        carried_error = _error(measure(after[hi][var], frames[hi][var], None))
                    order = call.end - 1 + (g_hi + 1) / (len(statements) + 2)
                    row = _row(block_label(block), instr, var, call.occurrence, m, carried_error, region, order)
                    row["_instr"] = instr
                    rows.append(row)
        chain_runner = None
        if after is not None:
            def chain_runner(args: Any, kwargs: dict) -> Any:
                out = self.chain(BlockCall(block, args, kwargs, None, -1, 0), segments, frames)
                if out is None:
                    raise RegionRefused("a segment failed chained")
                return _returned(final, out[-1])

        return rows, chain_runner


def _statement_vars(statements: list, lo: int, hi: int, outputs: list) -> list:
    """(variable, instruction binding it last) for the source statement made of instructions
    `[lo, hi)`: its named variables, else the temporary the block returns."""
    found: dict = {}
    for instr in statements[lo:hi]:
        for inner in walk_instructions([instr]):
            for name in bound_names(inner):
                found[name] = instr
    named = [(n, i) for n, i in found.items() if not n.startswith("$")]
    return named or [(n, i) for n, i in found.items() if n in outputs]


def _same(a: Any, b: Any) -> bool:
    """torch.equal over the tensors of two results (NaNs in the same places count as equal)."""
    left = [v for v in pytree.tree_leaves(a) if isinstance(v, torch.Tensor)]
    right = [v for v in pytree.tree_leaves(b) if isinstance(v, torch.Tensor)]
    return len(left) == len(right) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(torch.nan_to_num(x), torch.nan_to_num(y))
        if x.is_floating_point() else torch.equal(x, y) for x, y in zip(left, right))


def _returned(final: Any, frame: dict) -> Any:
    if final is None:
        return None
    names = final.out_vars
    if final.as_tuple or len(names) > 1:
        return tuple(frame[n] for n in names)
    return frame[names[0]] if names else None


def _call_instruction(call: BlockCall) -> Any:
    """The instruction of the caller's code that made `call`: a call of the child by path, or through
    a value, on the line the caller's frame was at."""
    parent = call.parent
    if parent is None or parent.block.signature is None:
        return None
    candidates = []
    for instr in walk_instructions(parent.block.signature.body):
        if not isinstance(instr, BlockInstruction):
            continue
        if instr.callee_var is None:
            try:
                target = parent.block.find(instr.block_ref.path)
            except KeyError:
                continue
            if instr.block_ref.method:
                target = target.methods.get(instr.block_ref.method)
            if target is not call.block:
                continue
        candidates.append(instr)
    on_line = [i for i in candidates if i.location is not None
               and i.location.lineno <= call.line <= max(i.location.end_lineno, i.location.lineno)]
    by_path = [i for i in on_line or candidates if i.callee_var is None]
    chosen = by_path or on_line or candidates
    return chosen[0] if chosen else None


def _range_label(block: ModelBlockSchema, cuts: list, a: int, b: int) -> str:
    """The region of source statements `a..b-1` (instructions `cuts[a]..cuts[b]`)."""
    if b - a == 1:
        return "statement"
    statements, _ = block_statements(block)
    lines = [s.location.lineno for s in statements[cuts[a]:cuts[b]] if s.location is not None]
    where = f" (lines {min(lines)}-{max(lines)})" if lines else ""
    return f"statements {a + 1}-{b}{where} of {block_label(block) or block.name}"


def _segment_region(tested: _Tested) -> str:
    text = tested.label
    if tested.refused:
        text += f" (refused by the compiler: {tested.refused}; the enclosing region stands)"
    if tested.note:
        text += f" ({tested.note})"
    return text


def _error(m: Optional[Measure]) -> float:
    return math.nan if m is None else m.error


def _row(path: str, instr: Any, out_var: str, occurrence: int, m: Optional[Measure], carried: float, region: str,
         order: float) -> dict:
    location = instr.location if instr is not None else None
    return {"block_path": path, "file": location.filename if location else "",
            "line": location.lineno if location else 0, "source": location.code if location else "",
            "out_var": out_var, "occurrence": occurrence, "local_error": _error(m), "carried_error": carried,
            "bound": math.nan if m is None else m.bound, "flagged": bool(m is not None and m.flagged),
            "region": region, "_order": order}
