"""Interventions: replace the value of a source variable wherever a selector names it, in every run.

`interventions={selector: fn}` on `SchemaInterpreter.run`, `call`, `step_run` and `capture_run`.
The selector is a `keep=` selector (traces/selection.py: `"model.layers.3:hidden_states"`,
`"*.mlp:down_proj"`, `"call=model.layers.2"` for what a layer returns where its caller binds it)
plus two words of its own. One difference from `keep=`: a block glob names the blocks it matches,
not the blocks inside them (`"model.layers.3:hidden_states"` is the layer's own variable, never its
`input_layernorm`'s). Paths read as in `keep=`: `*` matches one segment and `**` crosses dots, so
`"model.layers.*:hidden_states"` names the layers' own variable and `"model.layers.**:hidden_states"`
those of their sub-blocks too (`run.sites` and a capture's `edited` steps say what was changed). The words:

- `index=[...]`: the part of the value the intervention sees and replaces, written as a Python
  subscript of ints, slices, `None` and `...` (`"model.layers.3:hidden_states index=[:, 2]"`: position
  2 of every sequence; `index=[:, :, 1]` is head 1 of a `[batch, position, head, dim]` value);
- `occurrence=N`: only the N-th time (from 0) the variable is bound in that block during the run
  (a block that runs twice, a variable bound twice in one forward: GPT-2's `hidden_states`).

`fn(value, site)` returns the new value (`value[index]` in, the new part out); a tensor may stand in
for `fn` and replaces the value (or the part) as is. The new value must have the shape, dtype and
device of what it replaces (an `InterventionError` says which site and what differs). `site` is a
`Site`: the block path, the variable, the occurrence, the layer (the first number of the path,
`model.layers.3.mlp` -> 3, or of the called block's path for a `call=` site), the called block,
the index, the step (stepped runs) and the run (`InterventionRun`: its inputs, its schema, the
sites changed so far). `Intervention(at, fn, index=..., occurrence=...)` says the same without text;
`interventions` is then a list of them.

Only variables bound to a tensor are intervened on. The new value is written into the live frame
by `runtime.stepping.apply_edit`, as `StepInfo.edit` writes an edit, and reported to the run's
listeners as an `EditEvent` (a capture keeps the new value and marks the step `edited`); autograd
sees it as any other op, so gradients flow through it. Interventions at several sites apply in
the order of `interventions`. After the run, an intervention that changed nothing (a selector that
matched nothing, an occurrence never reached) raises `InterventionError` naming the closest sites
that ran, never a silent no-op.

What runs: only the blocks a selector can touch (`KeepSelector.blocks_to_observe`) run observed;
the others run their plain generated code (runtime/partial.py). Without `interventions` nothing
changes: a run is the plain program.

Depends on runtime (interventions, interpreter, listeners), traces.selection and traces.descriptions.
"""

from __future__ import annotations

import ast
import difflib
import re
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import torch

from ..runtime.interpreter import apply_edit
from ..runtime.interventions import InterventionListener, use_interventions
from ..runtime.listeners import EditEvent, InstructionEvent
from ..schema.errors import SchemaRunError
from ..schema.model import BlockInstruction, ModelBlockSchema, OpInstruction, ReturnInstruction
from .descriptions import op_name_of
from .selection import KeepSelector, KeepTerm, keep_selector, path_matches

__all__ = ["Intervention", "Site", "InterventionRun", "InterventionError", "intervention", "parse_index"]


class InterventionError(SchemaRunError):
    """An intervention that cannot be applied: bad selector or value, or one that matched nothing."""


_INDEX = re.compile(r"(?:^|\s)index=\[")
_OCCURRENCE = re.compile(r"(?:^|\s)occurrence=(\S*)")


def parse_index(text: str) -> Any:
    """The subscript `text` (`":, 2"`, `"..., 0:4"`) as the object `value[...]` takes: ints, slices,
    None and Ellipsis, a tuple of them for several axes. Nothing else is read (no names, no calls)."""
    try:
        node = ast.parse(f"_[{text}]", mode="eval").body.slice  # type: ignore[attr-defined]
    except SyntaxError as exc:
        raise InterventionError(f"index=[{text}] is not a subscript; write e.g. index=[:, 2] or index=[..., 0:4]") from exc

    def read(item: ast.AST, top: bool) -> Any:
        if isinstance(item, ast.Tuple) and top:
            return tuple(read(elt, False) for elt in item.elts)
        if isinstance(item, ast.Slice):
            return slice(*(None if part is None else read(part, False) for part in (item.lower, item.upper, item.step)))
        if isinstance(item, ast.Constant) and (item.value is None or item.value is Ellipsis or type(item.value) is int):
            return item.value
        if isinstance(item, ast.UnaryOp) and isinstance(item.op, ast.USub) and isinstance(item.operand, ast.Constant) \
                and type(item.operand.value) is int:
            return -item.operand.value
        raise InterventionError(f"index=[{text}]: {ast.unparse(item)!r} is not an int, a slice, None or ...")

    return read(node, True)


@dataclass(frozen=True)
class Intervention:
    """Replace what `at` (a keep selector) names with `fn(value, site)`, or with the tensor `fn`.

    `index`: the part of the value to replace (what `value[index]` takes); `occurrence`: only the
    N-th binding (from 0) of the variable in its block during the run.
    """

    at: Union[str, KeepTerm, KeepSelector]
    fn: Any
    index: Any = None
    occurrence: Optional[int] = None
    selector: KeepSelector = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            selector = keep_selector(self.at)
        except (ValueError, TypeError) as exc:
            raise InterventionError(f"intervention at {self.at!r}: {exc}") from exc
        if selector is None:
            raise InterventionError("an intervention needs a selector (at=...), such as 'model.layers.3:hidden_states'")
        for term in selector.terms:
            if term.slot is not None and term.slot != "activation":
                raise InterventionError(f"intervention at {self.at!r}: only activations can be intervened on "
                                        f"(slot={term.slot}); change an input in the scope you pass instead")
        if not (callable(self.fn) or isinstance(self.fn, torch.Tensor)):
            raise InterventionError(f"intervention at {self.at!r}: give fn(value, site) or a tensor, got "
                                    f"{type(self.fn).__name__}")
        if self.occurrence is not None and (type(self.occurrence) is not int or self.occurrence < 0):
            raise InterventionError(f"intervention at {self.at!r}: occurrence must be an int >= 0, got {self.occurrence!r}")
        object.__setattr__(self, "selector", selector)

    def text(self) -> str:
        """The selector as `interventions=` text reads it back (an index that is not text is shown as Python)."""
        words = [self.selector.text()]
        if self.index is not None:
            words.append(f"index=[{_index_text(self.index)}]")
        if self.occurrence is not None:
            words.append(f"occurrence={self.occurrence}")
        return " ".join(words)


def intervention(at: Any, fn: Any) -> Intervention:
    """The `Intervention` of one `interventions=` entry: `at` is text with `index=[...]` and
    `occurrence=N` words read out of it, a `KeepTerm` or a `KeepSelector`."""
    if not isinstance(at, str):
        return Intervention(at, fn)
    text, index, occurrence = at, None, None
    found = _INDEX.search(text)
    if found:
        start = found.end()
        depth, end = 1, start
        while end < len(text) and depth:
            depth += {"[": 1, "]": -1}.get(text[end], 0)
            end += 1
        if depth:
            raise InterventionError(f"intervention at {at!r}: index=[ has no closing ]")
        index = parse_index(text[start:end - 1])
        text = text[:found.start()] + " " + text[end:]
    found = _OCCURRENCE.search(text)
    if found:
        if not found.group(1).isdigit():
            raise InterventionError(f"intervention at {at!r}: occurrence= takes an int >= 0, got {found.group(1)!r}")
        occurrence = int(found.group(1))
        text = text[:found.start()] + " " + text[found.end():]
    return Intervention(" ".join(text.split()), fn, index, occurrence)


def _index_text(index: Any) -> str:
    parts = index if isinstance(index, tuple) else (index,)

    def one(part: Any) -> str:
        if isinstance(part, slice):
            text = ("" if part.start is None else str(part.start)) + ":" + ("" if part.stop is None else str(part.stop))
            return text + (f":{part.step}" if part.step is not None else "")
        return "..." if part is Ellipsis else repr(part)

    return ", ".join(one(part) for part in parts)


def interventions_of(interventions: Any) -> list[Intervention]:
    """The `Intervention`s of an `interventions=` argument: {selector: fn}, a list of `Intervention`s, or one."""
    if isinstance(interventions, Intervention):
        return [interventions]
    if isinstance(interventions, dict):
        items = [intervention(at, fn) for at, fn in interventions.items()]
    elif isinstance(interventions, (list, tuple)) and all(isinstance(i, Intervention) for i in interventions):
        items = list(interventions)
    else:
        raise InterventionError("interventions must be {selector: fn or tensor} (e.g. {'model.layers.3:hidden_states': "
                                f"fn}}), an Intervention or a list of them; got {type(interventions).__name__}")
    if not items:
        raise InterventionError("interventions={} names no site; pass None for a run without interventions")
    return items


def _single(item: Intervention) -> bool:
    """Whether `item` can apply once per run: one occurrence of one `path:var`, neither a glob."""
    terms = item.selector.terms
    if item.occurrence is None or len(terms) != 1:
        return False
    term = terms[0]
    return all(text is not None and not any(c in text for c in "*?[") for text in (term.block, term.var))


def _layer_of(path: str) -> Optional[int]:
    """The first number of a block path: `model.layers.3.mlp` -> 3; None when it has none."""
    for part in path.split("."):
        if part.isdigit():
            return int(part)
    return None


@dataclass(frozen=True)
class Site:
    """Where an intervention is applied: `var` bound in the block at `path`, its `occurrence`-th
    binding there in this run (from 0); `call` is the called block's path when the value is what a
    block call returned, `layer` the first number of `call` (or else of `path`); `index` the part
    replaced; `step` the step number in a stepped run (else None); `run` the `InterventionRun`."""

    path: str
    var: str
    occurrence: int
    layer: Optional[int]
    call: Optional[str]
    index: Any
    step: Optional[int]
    run: "InterventionRun" = field(repr=False, compare=False)

    @property
    def name(self) -> str:
        return f"{self.path}:{self.var}"

    def record(self, name: str, value: Any, description: str = "", op: str = "") -> None:
        """Report `value` as a variable `name` of this site's block (a capture keeps it as a step of its
        own, after the site's: an SAE's features); only tensors are reported."""
        self.run.report(self, name, value, description or f"Value {name} computed at {self.name}", op)


class InterventionRun(InterventionListener):
    """One run's interventions: the listener the runtime adds (runtime/interventions.py).

    `inputs` and `schema` are the run's; `sites` lists the `Site`s changed so far, in order.
    """

    def __init__(self, root: ModelBlockSchema, items: list[Intervention]):
        super().__init__()
        self.schema = root
        self.items = items
        self.inputs: dict = {}
        self.sites: list[Site] = []
        self._counts: dict[tuple[str, str], int] = {}
        self._seen: dict[tuple[str, str], None] = {}  # the (path, var) bound to a tensor, in order
        self._hits = [0] * len(items)  # matches, whatever the occurrence
        self._applied = [0] * len(items)
        self._ops = any(t.op is not None for item in items for t in item.selector.terms)
        self._module_blocks: Optional[dict[int, ModelBlockSchema]] = None
        self._pending: list[tuple] = []  # values reported at the site being changed (`report`)
        self._candidates: dict[str, list[int]] = {}  # path -> the items whose selector may name a variable there
        # every item names one occurrence of one variable: once each is applied, nothing later can match
        self._once = all(_single(item) for item in items)
        self._done = False
        observe: Optional[frozenset] = frozenset()
        for item in items:
            blocks = item.selector.blocks_to_observe(root)
            observe = None if observe is None or blocks is None else observe | blocks
        self.observe = observe

    def on_run_start(self, root: ModelBlockSchema, scope: dict) -> None:
        self.inputs = scope

    def tensor_result_hook(self) -> Callable[[Any, dict, Any], None]:
        """The observer's direct call (this listener alone): nothing is built once every item is applied,
        else the event `on_instruction` takes, for a tensor bound to a variable."""
        def after(instr: Any, frame: dict, observer: Any) -> None:
            if self._done or instr.__class__ is ReturnInstruction:
                return
            var = instr.out_var
            value = frame.get(var) if var else None
            if isinstance(value, torch.Tensor):
                self.on_instruction(InstructionEvent(instr, frame, observer.depth, observer.block, observer.path, value,
                                                     True, observer.frames_tuple(), observer.conditions == 0))

        return after

    def on_instruction(self, event: InstructionEvent) -> None:
        if self._done:
            return
        instr = event.instruction
        value = event.value
        var = instr.out_var
        if not var or not isinstance(value, torch.Tensor) or instr.__class__ is ReturnInstruction:
            return
        path = event.path
        key = (path, var)
        self._seen[key] = None
        candidates = self._candidates.get(path)
        if candidates is None:
            candidates = self._candidates[path] = [i for i, item in enumerate(self.items)
                                                   if item.selector.may_keep_activations(path)]
        if not candidates:
            return
        occurrence = self._counts[key] = self._counts.get(key, -1) + 1
        is_call = isinstance(instr, BlockInstruction)
        callee = self._callee(instr, event) if is_call else None
        op = callee if is_call else (op_name_of(instr, event.frame) if self._ops else "")
        for i in candidates:
            item = self.items[i]
            key = (item.selector, path, var, op, is_call)
            hit = _MATCHED.get(key)
            if hit is None:  # a block glob names its own blocks here, not the blocks inside them
                if len(_MATCHED) > 100_000:
                    _MATCHED.clear()
                hit = _MATCHED[key] = any(
                    t.matches(path, var, op or "", "activation", is_call)
                    and (t.block is None or path_matches(path, t.block, inside=False)) for t in item.selector.terms)
            if not hit:
                continue
            self._hits[i] += 1
            if item.occurrence is not None and item.occurrence != occurrence:
                continue
            step = self.step_of() if self.step_of is not None else None
            site = Site(path, var, occurrence, _layer_of(callee if callee is not None else path), callee, item.index,
                        step, self)
            new = self._new_value(item, value, site)
            old = apply_edit(event.frames, event.depth, var, new, None, None, step or 0)
            edit = EditEvent(step or 0, event.depth, var, old, new)
            for listener in self.edit_listeners:
                listener.on_edit(edit)
            event.value = value = new  # the listeners after this one (the stepper) see the new value
            self._applied[i] += 1
            self.sites.append(site)
            if self._once and all(self._applied):
                self._done = True
            if self._pending:  # values the intervention reported, after the edit of the site's step
                pending, self._pending = self._pending, []
                for name, reported, description, op in pending:
                    for listener in self.value_listeners:
                        listener.on_value(path, event.depth, name, reported, description, op)

    def report(self, site: Site, name: str, value: Any, description: str, op: str) -> None:
        """A value an intervention computed at `site` (`Site.record`), told to the run's listeners
        after the site's edit."""
        if not isinstance(name, str) or not name:
            raise InterventionError(f"a value recorded at {site.name} needs a name, got {name!r}")
        if isinstance(value, torch.Tensor):
            self._pending.append((name, value, description, op))

    def _callee(self, instr: BlockInstruction, event: InstructionEvent) -> str:
        """The path of the block a block call ran (resolved as the recorder resolves it)."""
        ref = instr.block_ref
        if instr.callee_var is not None:
            if self._module_blocks is None:
                self._module_blocks = _module_blocks(self.schema)
            held = self._module_blocks.get(id(event.frame.get(instr.callee_var)))
            block = held() if held is not None else None
            return block.path if block is not None else ref.path
        try:
            return event.block.find(ref.path).path
        except KeyError:
            return ref.path

    def _new_value(self, item: Intervention, value: torch.Tensor, site: Site) -> torch.Tensor:
        part = value
        if item.index is not None:
            try:
                part = value[item.index]
            except (IndexError, TypeError) as exc:
                raise InterventionError(f"intervention {item.text()!r} at {site.name} (occurrence {site.occurrence}): "
                                        f"index [{_index_text(item.index)}] does not apply to shape "
                                        f"{tuple(value.shape)}: {exc}") from exc
        new = item.fn(part, site) if not isinstance(item.fn, torch.Tensor) else item.fn
        if new is part:  # handed back as it was
            return value
        if not isinstance(new, torch.Tensor) or new.shape != part.shape or new.dtype != part.dtype \
                or new.device != part.device:
            where = f"intervention {item.text()!r} at {site.name} (occurrence {site.occurrence})"
            what = "the indexed part" if item.index is not None else "the value"
            if not isinstance(new, torch.Tensor):
                raise InterventionError(f"{where}: {what} is a tensor; the intervention gave {type(new).__name__} "
                                        "(fn(value, site) must return the new value)")
            for label, got, want in (("shape", tuple(new.shape), tuple(part.shape)), ("dtype", new.dtype, part.dtype),
                                     ("device", new.device, part.device)):
                if got != want:
                    raise InterventionError(f"{where}: {what} has {label} {want}; the intervention gave {got}")
        if item.index is None:
            return new
        whole = value.clone()
        whole[item.index] = new
        return whole

    def finish(self) -> None:
        missed = [i for i, applied in enumerate(self._applied) if not applied]
        if not missed:
            return
        lines = []
        for i in missed:
            item = self.items[i]
            if self._hits[i]:
                lines.append(f"{item.text()!r} matched {self._hits[i]} binding(s) but occurrence={item.occurrence} "
                             f"was never reached (occurrences count from 0)")
                continue
            close = difflib.get_close_matches(item.selector.text(), self._sites(), n=5, cutoff=0.3)
            hint = f"closest sites: {', '.join(close)}" if close else "no tensor variable that ran is close to it"
            lines.append(f"{item.text()!r} matched no tensor variable that ran; {hint}")
        raise InterventionError("an intervention changed nothing in this run:\n  " + "\n  ".join(lines))

    def _sites(self) -> list[str]:
        """`path:var` of the tensor variables that ran, then those of the blocks left unobserved."""
        names = [f"{path}:{var}" for path, var in self._seen if not var.startswith("$")]
        if self.observe is not None:
            seen = set(names)
            names += [name for name in _static_sites(self.schema) if name not in seen]
        return names


_MATCHED: dict[tuple, bool] = {}  # (selector, path, var, op, is_call) -> whether an intervention's selector names it
_MODULE_BLOCKS: "weakref.WeakKeyDictionary[ModelBlockSchema, dict]" = weakref.WeakKeyDictionary()


def _module_blocks(root: ModelBlockSchema) -> dict:
    """{id(module): weakref of its forward block} of a schema, worked out once per schema (a run's
    callees by identity; weak, so the entry does not keep the schema it is keyed by alive)."""
    found = _MODULE_BLOCKS.get(root)
    if found is None:
        found = _MODULE_BLOCKS[root] = {id(b.module): weakref.ref(b) for b in reversed(list(root.iter_blocks()))
                                        if b.module is not None and b.method_name is None}
    return found


def _static_sites(root: ModelBlockSchema) -> list[str]:
    """`path:var` of every named variable an instruction of the schema binds (what could run)."""
    out: dict[str, None] = {}

    def walk(instrs: list, path: str) -> None:
        for instr in instrs or ():
            var = getattr(instr, "out_var", None)
            if isinstance(instr, (OpInstruction, BlockInstruction)) and var and not var.startswith("$"):
                out[f"{path}:{var}"] = None
            for name in ("prepare", "body", "else_body", "final_body"):
                walk(getattr(instr, name, None) or [], path)
            for body in getattr(instr, "handler_bodies", None) or ():
                walk(body, path)
            function = getattr(instr, "function", None)
            if function is not None and not isinstance(function, ModelBlockSchema):
                walk(getattr(function, "body", None) or [], path)

    for block in root.iter_blocks():
        if block.signature is not None:
            walk(block.signature.body, block.path or block.name)
    return list(out)


def _compile(root: ModelBlockSchema, interventions: Any) -> InterventionRun:
    return InterventionRun(root, interventions_of(interventions))


use_interventions(_compile)
