"""The `keep=` selector: which captured tensors a capture keeps, by block path, variable, op and slot.

One selector serves `capture_run(..., keep=...)` (the recorder records only the steps it names) and
`capture_dataset(..., keep=...)` (the store writes only their tensors; statistics of every step
are written anyway). A selector is built from text, from `KeepTerm`s, or from a list of both; a
step is kept when any term matches it. One term of text reads

    block_glob[:var_glob] [op=op_glob] [call=block_glob] [slot=input|activation|output]

with shell-style globs (case-sensitive). In a block path (the block glob and `call=`) `*` and `?`
match within one path segment, never a dot, as a shell's do within one folder, and `**` crosses
dots: `"call=model.layers.*"` is each layer, `"call=model.layers.**"` every block inside them too.
Variable and op globs are `fnmatch`'s (an op's name holds dots: `"op=*linear"`). Examples:
`"transformer.h.*.attn:attn_output"`, `"model.layers.3"` (every variable of that block),
`"*:logits"`, `"op=*linear"`, `"call=model.layers.3"`, `"slot=output"`. Several terms are joined by
commas or given as a list. A term's block glob is matched against the step's block path and covers
the blocks inside the blocks it names (`"model.layers.3"` keeps what `model.layers.3.mlp` computes
too: a block glob matches a path or the path of a block that holds it); the root's path is its
class name, and inputs have an empty one, so select them with
`slot=input`.

`call=` keeps what a call of a block returns, where it returns it: the step of the *caller* that
binds the result of calling a block whose path matches (its forward or one of its methods), i.e.
the layer output a forward hook on that module sees (`"call=model.layers.3"`; `"call=model.layers.*"`
for every layer's output, not the calls made inside a layer: `"call=**"` is every block call). Only block calls match it (the step's description is a `describe_block_call`
text), never an op that happens to bear the name. A capture with it observes only the blocks that
can make such a call (`blocks_to_observe`), not the callee. A block returning a tuple or a dict
binds no tensor at its call, so a `call=` term naming only such blocks keeps nothing: the recorder
says so (`KeepMissedWarning`) rather than return an empty trace without a word.

Depends on the standard library; `blocks_to_observe` reads the schema's instructions.
"""

from __future__ import annotations

import functools
import re
import weakref
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Iterable, Optional, Union

__all__ = ["KeepTerm", "KeepSelector", "keep_selector"]

SLOT_TYPES = ("input", "activation", "output")
_FIELD = re.compile(r"^(op|slot|call)=(.+)$")
# descriptions of block-call steps (traces/descriptions.describe_block_call): what `call=` matches
BLOCK_CALL_PREFIXES = ("Call to sub-block ", "Call to method ", "Call to self")
# per schema root: {selector: the blocks a capture with it observes} (KeepSelector.blocks_to_observe)
_OBSERVED: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
_PARSED: dict[str, "KeepSelector"] = {}  # selector text -> its selector (keep_selector)


@functools.lru_cache(maxsize=1024)
def _path_regex(glob: str, inside: bool) -> "re.Pattern[str]":
    """The block-path glob as a regex matching a path (`inside`: or a path inside it): `*` and `?` within one
    segment, `**` across dots, `[...]` a set of characters (`[!...]` its complement) as fnmatch's."""
    out, i, n = [], 0, len(glob)
    while i < n:
        c = glob[i]
        if glob.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^.]*")
        elif c == "?":
            out.append("[^.]")
        elif c == "[":
            j = i + 1
            if j < n and glob[j] in "!^":
                j += 1
            if j < n and glob[j] == "]":
                j += 1
            j = glob.find("]", j)
            if j < 0:
                out.append(re.escape(c))
            else:
                inner = glob[i + 1:j].replace("\\", "\\\\")
                out.append("[" + ("^" + inner[1:] if inner[:1] in "!^" else inner) + "]")
                i = j + 1
                continue
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("(?:" + "".join(out) + (r")(?:\..*)?" if inside else ")"), re.DOTALL)


def path_matches(path: str, glob: str, inside: bool = True) -> bool:
    """Whether the block path `path` matches the path glob `glob` (`*` one segment, `**` across dots);
    `inside`: or lies inside a block whose path matches it (`"model.layers.3"` covers `model.layers.3.mlp`)."""
    return _path_regex(glob, inside).fullmatch(path) is not None


@dataclass(frozen=True)
class KeepTerm:
    """One alternative of a selector: every field given must match (None matches anything)."""

    block: Optional[str] = None
    var: Optional[str] = None
    op: Optional[str] = None
    slot: Optional[str] = None
    call: Optional[str] = None

    def __post_init__(self) -> None:
        for name in ("block", "var", "op", "slot", "call"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"KeepTerm.{name} must be a non-empty glob string or None, got {value!r}")
        if self.slot is not None and not any(fnmatchcase(s, self.slot) for s in SLOT_TYPES):
            raise ValueError(f"KeepTerm.slot {self.slot!r} matches no slot type; use one of {', '.join(SLOT_TYPES)}")

    def matches(self, block_path: str, var: str, op: str, slot: str, call: bool = False) -> bool:
        """`call`: the step binds what a block call returned (its op is then the callee's path)."""
        return ((self.slot is None or fnmatchcase(slot, self.slot))
                and (self.block is None or path_matches(block_path, self.block))
                and (self.var is None or fnmatchcase(var, self.var))
                and (self.op is None or fnmatchcase(op, self.op))
                and (self.call is None or call and path_matches(op, self.call, inside=False)))

    def text(self) -> str:
        head = (self.block or "*") + (f":{self.var}" if self.var is not None else "")
        parts = [head] if (self.block is not None or self.var is not None) else []
        parts += [f"op={self.op}"] if self.op is not None else []
        parts += [f"call={self.call}"] if self.call is not None else []
        parts += [f"slot={self.slot}"] if self.slot is not None else []
        return " ".join(parts) or "*"


def _parse_term(text: str) -> KeepTerm:
    words = text.split()
    if not words:
        raise ValueError("an empty keep term; write e.g. 'transformer.h.*.attn:attn_output' or 'op=*linear'")
    fields: dict[str, str] = {}
    for word in words:
        found = _FIELD.match(word)
        if found:
            key, value = found.groups()
        else:
            key, value = "path", word
        if key in fields:
            raise ValueError(f"keep term {text!r} gives {key} twice")
        fields[key] = value
    block = var = None
    if "path" in fields:
        block, colon, var_text = fields["path"].partition(":")
        block = block or None
        var = var_text if colon else None
        if colon and not var_text:
            raise ValueError(f"keep term {text!r}: nothing after ':'; name a variable glob such as '*'")
    return KeepTerm(block=block, var=var, op=fields.get("op"), slot=fields.get("slot"), call=fields.get("call"))


def value_name(block_path: str, out_var: str, op_name: str, slot_type: str, description: str) -> str:
    """The name a person writes for a step's value, before its `#n` (the n-th of that name in an input):
    `h.3:output` for what a call of the sub-block `h.3` returned (where its caller binds it, as a forward
    hook on `h.3` sees it), `h.3.attn:attn_output` for a variable of a block, `input_ids` for an input.
    A call of a block's method or of `self` keeps its variable's name. The store's `name` column is this,
    with `#n` from the second on (store/reader.py, `STEP_NAME_SQL` the same in SQL)."""
    if slot_type == "activation" and op_name and description.startswith(BLOCK_CALL_PREFIXES[0]):
        return f"{op_name}:output"
    return f"{block_path}:{out_var}" if block_path else out_var


def is_block_call(description: str) -> bool:
    """Whether a step's description says it binds what a block call returned (what `call=` matches)."""
    return description.startswith(BLOCK_CALL_PREFIXES)



def _callers(blocks: list, glob: str) -> set:
    """Paths of the blocks (of `blocks`, a schema's `iter_blocks()`) with an instruction that can
    call a block whose path matches `glob`, i.e. bind a step `call=glob` keeps: a call of a child
    named in the source (`self.layers[3](x)`, resolved as the recorder names it), or of a module
    held in a variable (`for layer in self.layers: x = layer(x)`) when `glob` matches any block's
    path. A module reached through a value the lowering saw as no module (an `OpInstruction` whose
    callee is a variable) is caught at run time instead: `Program.watch` (runtime/partial.py)."""
    from ..schema.model import BlockInstruction  # the schema's classes, only when a call= term needs them

    every = {b.path for b in blocks if b.path}
    dynamic = any(path_matches(path, glob, inside=False) for path in every)
    found = set()
    for block in blocks:
        if block.signature is None:
            continue
        for instr in _instructions(block.signature.body):
            if not isinstance(instr, BlockInstruction):
                continue
            ref = instr.block_ref
            if instr.callee_var is not None:
                hit = dynamic or path_matches(ref.path, glob, inside=False)
            else:
                try:
                    callee = block.find(ref.path)
                except KeyError:
                    callee = None
                hit = path_matches(callee.path if callee is not None else ref.path, glob, inside=False)
            if hit:
                found.add(block.path)
                break
    return found


def _instructions(instrs: list) -> Any:
    """Every instruction of a body, those of nested statements and of closures defined in it
    (they run in the block's program and their steps carry its path) included."""
    from ..schema.model import (ControlInstruction, FunctionInstruction, TryInstruction, WithInstruction,
                                condition_instructions)

    for instr in instrs:
        yield instr
        if isinstance(instr, ControlInstruction):
            yield from _instructions(condition_instructions(instr))
            yield from _instructions(instr.body)
            yield from _instructions(instr.else_body or [])
        elif isinstance(instr, TryInstruction):
            for body in (instr.body, *instr.handler_bodies, instr.else_body or [], instr.final_body or []):
                yield from _instructions(body)
        elif isinstance(instr, WithInstruction):
            yield from _instructions(instr.body)
        elif isinstance(instr, FunctionInstruction) and instr.function is not None:
            yield from _instructions(instr.function.body)


class KeepSelector:
    """A union of `KeepTerm`s; `matches(block_path, var, op, slot)` says whether a step is kept."""

    __slots__ = ("terms", "calls", "_cache", "_blocks", "_calls_only")

    def __init__(self, terms: Iterable[KeepTerm]):
        self.terms = tuple(terms)
        if not self.terms:
            raise ValueError("a keep selector needs at least one term")
        self.calls = any(t.call is not None for t in self.terms)  # whether `matches` needs its `call` flag
        self._cache: dict[tuple, bool] = {}
        self._blocks: dict[str, bool] = {}  # block path -> may_keep_activations(path)
        self._calls_only: dict[str, bool] = {}  # block path -> keeps_calls_only(path)

    def may_keep_activations(self, block_path: str) -> bool:
        """Whether some activation of the block at `block_path` can match (False: none of its
        activation steps is kept, whatever its variable or op), so a recorder can skip describing them."""
        hit = self._blocks.get(block_path)
        if hit is None:
            hit = self._blocks[block_path] = any(
                (t.slot is None or fnmatchcase("activation", t.slot))
                and (t.block is None or path_matches(block_path, t.block))
                for t in self.terms)
        return hit

    def keeps_calls_only(self, block_path: str) -> bool:
        """Whether every term that can keep an activation of the block at `block_path` is a `call=`
        term: a step there that is no block call is then never kept (a recorder need not describe it)."""
        hit = self._calls_only.get(block_path)
        if hit is None:
            hit = self._calls_only[block_path] = all(
                t.call is not None for t in self.terms
                if (t.slot is None or fnmatchcase("activation", t.slot))
                and (t.block is None or path_matches(block_path, t.block)))
        return hit

    def matches(self, block_path: str, var: str, op: str, slot: str, call: bool = False) -> bool:
        key = (block_path, var, op, slot, call)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = any(t.matches(block_path, var, op, slot, call) for t in self.terms)
        return hit

    def keeps_call_of(self, callee_path: str, caller_path: Optional[str] = None) -> bool:
        """Whether some `call=` term can keep the value a call of the block at `callee_path` returns
        (made from the block at `caller_path`, when given: a term's block glob must match it)."""
        return any(t.call is not None and path_matches(callee_path, t.call, inside=False) and (
            caller_path is None or t.block is None or path_matches(caller_path, t.block)) for t in self.terms)

    def blocks_to_observe(self, root: Any) -> Optional[frozenset]:
        """Ids of the blocks of the schema `root` a capture must observe to see every step this
        selector can keep: the blocks whose path a term's block glob names (with what is inside
        them), for a `call=` term without one the blocks that can call a block it names
        (`_callers`), every block on the way to them (their ancestors by path, method blocks
        included) and the root. None when a term that can keep activations names neither a block
        nor a call (`op=...`, a bare `slot=activation`): then every block is observed. The answer
        is cached per schema."""
        cache = _OBSERVED.get(root)
        if cache is None:
            cache = _OBSERVED[root] = {}
        if self in cache:
            return cache[self]
        terms = [t for t in self.terms if t.slot is None or fnmatchcase("activation", t.slot)]
        if any(t.block is None and t.call is None for t in terms):
            cache[self] = None
            return None
        blocks = list(root.iter_blocks())
        matched = {b.path for b in blocks
                   if any(t.block is not None and path_matches(b.path or b.name, t.block) for t in terms)}
        for term in terms:
            if term.block is None:
                matched |= _callers(blocks, term.call)
        observe = frozenset(id(b) for b in blocks if b is root or not b.path and matched or any(
            m == b.path or m.startswith(b.path + ".") for m in matched))
        cache[self] = observe
        return observe

    def text(self) -> str:
        """The selector as text that `keep_selector` reads back to an equal selector."""
        return ", ".join(term.text() for term in self.terms)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeepSelector) and self.terms == other.terms

    def __hash__(self) -> int:
        return hash(self.terms)

    def __repr__(self) -> str:
        return f"KeepSelector({self.text()!r})"


KeepSpec = Union[str, KeepTerm, KeepSelector, Iterable[Union[str, KeepTerm]]]


def keep_selector(keep: Any) -> Optional[KeepSelector]:
    """The KeepSelector of a `keep=` argument (None stays None); a bad argument raises a ValueError or TypeError."""
    if keep is None or isinstance(keep, KeepSelector):
        return keep
    if isinstance(keep, KeepTerm):
        return KeepSelector([keep])
    if isinstance(keep, str):
        known = _PARSED.get(keep)
        if known is not None:  # the same text, the same selector (and its cache of matches)
            return known
        selector = keep_selector(keep.split(","))
        if len(_PARSED) >= 256:
            _PARSED.clear()
        _PARSED[keep] = selector
        return selector
    if isinstance(keep, (list, tuple)):
        items = list(keep)
    else:
        raise TypeError(f"keep must be a string such as 'transformer.h.*.attn:attn_output', a KeepTerm, a list of "
                        f"them, or None; got {type(keep).__name__}")
    terms = []
    for item in items:
        if isinstance(item, KeepTerm):
            terms.append(item)
        elif isinstance(item, str):
            terms.append(_parse_term(item))
        else:
            raise TypeError(f"a keep term is a string or a KeepTerm, got {type(item).__name__}")
    return KeepSelector(terms)
