"""A `keep=` selector compiled for a logged program: what each instruction of a schema keeps.

`capture_run(keep=...)` runs a *kept* logged program (runtime/step_log.py) when the selector can be
decided where the code is generated: the generated code appends only the kept tensors (with their
numbers in a capture of everything) and counts the others, and the rest of the run is plain code.
`KeepPlan.decision(instr, unit)` answers, once per op or block call binding a tensor in the
function `unit` of the block at path `P`, what the recorder would decide at each run of it
(`ActivationRecorder._took`: `selector.matches(P, var, op, "activation", block call?)`):

- a fixed callee (an op with a fixed target, a block call by path): the recorder's description and
  op name do not change from run to run, so it is kept (True) or only counted (False);
- a block call through a variable (`for layer in self.layers: x = layer(x)`): the called module
  says which block it is, so a `KeptIds` of the schema's modules decided otherwise than a module
  outside the schema (one `id()` test at run time);
- an op whose callee is a variable (a fetched method `$t5 = x.view; $t5(...)`, a module in a
  variable): a module of the schema is a block call (the same `KeptIds`); anything else is an op,
  whose name matters only to an `op=` term: when one can match there, a call per run of the
  instruction decides (`keeps(callee)`, the recorder's own description).

What only a run knows keeps the observed path (`keep_plan` says why): a closure or generator
expression runs at its *caller's* block path (and describes a call by path from its caller's
block), so a schema with one that binds tensors is logged only when no term's block glob tells the
schema's paths apart (and, with `op=` or `call=` terms, no closure calls a block by path).
Plans are cached per schema and selector, a few at a time.

Depends on runtime (log_plan), the schema, selection, descriptions and the recorder's description
methods.
"""

from __future__ import annotations

import weakref
from fnmatch import fnmatchcase
from typing import Any, Optional

from ..runtime.log_plan import KeptIds, LogPlan
from ..schema.model import BlockInstruction, FunctionInstruction, ModelBlockSchema, OpInstruction, VarRef
from .descriptions import describe_block_call
from .recorder import ActivationRecorder
from .selection import KeepSelector, KeepTerm, _instructions, is_block_call, path_matches

__all__ = ["KeepPlan", "keep_plan"]

_PLANS: "weakref.WeakKeyDictionary[ModelBlockSchema, dict]" = weakref.WeakKeyDictionary()
_KEEP = 8  # plans kept per schema


def keep_plan(root: ModelBlockSchema, keep: KeepSelector) -> tuple[Optional["KeepPlan"], Optional[str]]:
    """(the plan of `keep` over the schema `root`, None) or (None, why a run must decide it)."""
    cache = _PLANS.get(root)
    if cache is None:
        cache = _PLANS[root] = {}
    plan = cache.get(keep)
    if plan is None:
        plan = _why_not(root, keep) or KeepPlan(root, keep)
        if len(cache) >= _KEEP:
            cache.pop(next(iter(cache)))
        cache[keep] = plan
    return (None, plan) if isinstance(plan, str) else (plan, None)


def _activation_terms(keep: KeepSelector) -> list[KeepTerm]:
    return [t for t in keep.terms if t.slot is None or fnmatchcase("activation", t.slot)]


def _why_not(root: ModelBlockSchema, keep: KeepSelector) -> Optional[str]:
    """Why `keep` cannot be decided per instruction of `root`'s code (None: it can)."""
    inner: list = []  # what closures and generator expressions bind (they run at their caller's path)
    for block in root.iter_blocks():
        if block.signature is None or block.skip_reason is not None:
            continue
        for instr in _instructions(block.signature.body):
            if isinstance(instr, FunctionInstruction) and instr.function is not None:
                inner.extend((block, i) for i in _instructions(instr.function.body)
                             if isinstance(i, (OpInstruction, BlockInstruction)) and i.out_var)
    if not inner:
        return None
    terms = _activation_terms(keep)
    paths = {b.path or b.name for b in root.iter_blocks()}
    where = inner[0][0].path or inner[0][0].name
    for term in terms:
        if term.block is not None and not all(path_matches(p, term.block) for p in paths):
            return (f"a closure or generator expression (in {where}) runs at its caller's block path, and the "
                    f"term {term.text()!r} keeps some paths and not others")
    if any(t.op is not None or t.call is not None for t in terms) and any(
            isinstance(i, BlockInstruction) and i.callee_var is None for _, i in inner):
        return f"a closure (in {where}) calls a block by path, which names its callee from its caller's block"
    return None


class _WeakBlocks:
    """{id(module): its forward block} of a schema (`ActivationRecorder._blocks_by_module`), held weakly."""

    __slots__ = ("refs",)

    def __init__(self, root: ModelBlockSchema):
        self.refs: dict[int, Any] = {}
        for block in root.iter_blocks():
            if block.module is not None and block.method_name is None:
                self.refs.setdefault(id(block.module), weakref.ref(block))

    def get(self, key: int) -> Optional[ModelBlockSchema]:
        ref = self.refs.get(key)
        return ref() if ref is not None else None


class _Describer:
    """The recorder's description methods over tables of their own (a plan outlives no run's recorder)."""

    __slots__ = ("_ops", "_calls", "_blocks")

    def __init__(self, root: ModelBlockSchema):
        self._ops: dict = {}
        self._calls: dict = {}
        self._blocks = _WeakBlocks(root)

    def _blocks_by_module(self) -> _WeakBlocks:
        return self._blocks

    _describe_op = ActivationRecorder._describe_op
    _describe_block = ActivationRecorder._describe_block


class KeepPlan(LogPlan):
    """A selector's decisions over one schema's code (see the module text). It holds the schema
    only weakly: programs compiled with it are cached in the schema's own cache."""

    def __init__(self, root: ModelBlockSchema, keep: KeepSelector):
        self.key = keep
        self.keep = keep
        self.describe = _Describer(root)
        self._terms = _activation_terms(keep)
        self._sets: dict[tuple, KeptIds | bool] = {}  # (kind, terms, ...) -> the decision by module

    def decision(self, instr: Any, unit: Any) -> Any:
        block = unit.block
        path, var, keep = block.path or block.name, instr.out_var, self.keep
        terms = tuple(t for t in self._terms if (t.block is None or path_matches(path, t.block))
                      and (t.var is None or fnmatchcase(var, t.var)))
        if not terms:
            return False
        describe = self.describe
        if isinstance(instr, OpInstruction):
            if not isinstance(instr.target, VarRef):
                text, op = describe._describe_op(instr, {})[:2]
                return keep.matches(path, var, op, "activation", keep.calls and is_block_call(text))
            if any(t.op is not None for t in terms):  # the op's name decides, and only a run knows it
                return self._keeps(instr, path, var)
            default = keep.matches(path, var, "", "activation", False)  # no block call: its name matters to no term
            return self._by_module(("op", terms, default), terms, default, None)
        ref = instr.block_ref
        if instr.callee_var is None:
            text, op = describe._describe_block(instr, {}, block)[:2]
            return keep.matches(path, var, op, "activation", keep.calls and is_block_call(text))
        # a module outside the schema (or no module) is named by the reference's path
        text = describe_block_call(ref.path, None, ref.method)
        default = keep.matches(path, var, ref.path, "activation", keep.calls and is_block_call(text))
        return self._by_module(("block", terms, default, ref.method), terms, default, ref.method)

    def _by_module(self, key: tuple, terms: tuple, default: bool, method: Any) -> Any:
        """The decision for a call of each module of the schema, as a `KeptIds` of those decided
        otherwise than `default` (`default` itself when none is): the recorder describes such a call
        as a call of the module's block (`_describe_op`, or with `method`, `_describe_block`)."""
        known = self._sets.get(key)
        if known is not None:
            return known
        calls = self.keep.calls
        ids = []
        for module_id, ref in self.describe._blocks.refs.items():
            block = ref()
            if block is None:
                continue
            text = describe_block_call(block.path, block, method) if key[0] == "block" else \
                describe_block_call(block.path, block)
            call = calls and is_block_call(text)
            # the terms already match the caller's path and the variable: the callee decides the rest
            if any(_callee_matches(t, block.path, call) for t in terms) is not default:
                ids.append(module_id)
        decided = self._sets[key] = KeptIds(frozenset(ids), default) if ids else default
        return decided

    def _keeps(self, instr: OpInstruction, path: str, var: str) -> Any:
        """`keeps(callee)` for an op whose callee is read at run time and whose name a term matches."""
        describe, matches, calls = self.describe._describe_op, self.keep.matches, self.keep.calls
        name = instr.target.name

        def keeps(callee: Any) -> bool:
            text, op = describe(instr, {name: callee})[:2]
            return matches(path, var, op, "activation", calls and is_block_call(text))

        return keeps


def _callee_matches(term: KeepTerm, op: str, call: bool) -> bool:
    """`term.matches` of a step whose path and variable it matches: what its op and call fields say."""
    return (term.op is None or fnmatchcase(op, term.op)) and (
        term.call is None or call and path_matches(op, term.call, inside=False))
